"""Runs one tool call and turns every way it can go wrong into a structured result.

One small dispatcher: the tool's ``runner`` strategy runs it (a Python function in
this process, or an executable in the sandbox), and what comes back is checked here
the same way for every kind: JSON, within the tool's limit or kept as an artifact.

A Python tool that hangs cannot be killed from inside its process: it runs in its
own daemon thread, is told to stop (``ToolContext.cancelled`` turns true, and its
next ``heartbeat`` raises) and is abandoned at its timeout (the model sees TIMEOUT).
A subprocess tool is killed, with everything it started.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from agentfleet.errors import ErrorCode, ToolError
from agentfleet.harness.subprocess_runner import SubprocessRunner
from agentfleet.harness.timeouts import call_with_timeout
from agentfleet.loop.transcript import ToolResult
from agentfleet.tools.artifacts import artifact_view, content_ref
from agentfleet.tools.tool import Produced, Tool, ToolContext

log = logging.getLogger(__name__)


class InProcess:
    """The default strategy: the function runs in a thread of the executor, abandoned at its timeout."""

    kind = "python"

    def run(self, tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, timeout_s: float) -> Produced | ToolResult:
        assert tool.func is not None
        if tool.context_param:
            kwargs = {**kwargs, tool.context_param: ctx}
        func = tool.func
        called = call_with_timeout(lambda: func(**kwargs), timeout_s, name=f"tool:{tool.name}:{ctx.call_id}")
        if not called.finished:
            ctx.stop()  # its heartbeat now raises, and ``ctx.cancelled`` says so, if it ever looks
            return timed_out(tool, timeout_s)
        if called.error is not None:
            return _failure_from(called.error, tool, ctx)
        return Produced(called.value)


IN_PROCESS = InProcess()


def runner_for(tool: Tool) -> InProcess | SubprocessRunner:
    """How this tool's calls run, chosen here from its data: its command in the sandbox, or its function in a
    thread of the executor."""
    return SubprocessRunner(tool.command) if tool.command is not None else IN_PROCESS


def run_tool(tool: Tool, arguments: dict[str, Any], ctx: ToolContext, default_timeout_s: float) -> ToolResult:
    """Run one call; ``default_timeout_s`` applies when the tool declares no timeout of its own."""
    started = time.perf_counter()
    try:
        kwargs = tool.bind(arguments)
    except ToolError as exc:
        return ToolResult.failure(exc.code, exc.message, exc.hint, _ms(started))
    return run_bound(tool, kwargs, ctx, default_timeout_s, started)


def run_bound(tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, default_timeout_s: float,
              started: float | None = None) -> ToolResult:
    """Run a call whose arguments ``Tool.bind`` has validated."""
    started = time.perf_counter() if started is None else started
    timeout = tool.timeout_s or default_timeout_s
    outcome = runner_for(tool).run(tool, kwargs, ctx, timeout)
    if isinstance(outcome, ToolResult):
        return outcome.model_copy(update={"duration_ms": _ms(started)})
    return _checked_output(tool, outcome, _ms(started))


def timed_out(tool: Tool, timeout_s: float) -> ToolResult:
    return ToolResult.failure(ErrorCode.TIMEOUT, f"{tool.name} did not finish within {timeout_s:g}s",
                              "The tool may be overloaded; try narrower arguments or another tool.")


def _failure_from(exc: BaseException, tool: Tool, ctx: ToolContext) -> ToolResult:
    if isinstance(exc, ToolError):
        return ToolResult.failure(exc.code, exc.message, exc.hint)
    # The model gets a line; the operator gets the traceback (with the step's run, call and trace ids).
    log.error("tool %s raised %s", tool.name, type(exc).__name__, exc_info=exc,
              extra={"tool": tool.name, "run_id": ctx.run_id, "call_id": ctx.call_id})
    return ToolResult.failure(
        ErrorCode.INTERNAL,
        f"{tool.name} raised {type(exc).__name__}: {exc}",
        "This is a bug or outage in the tool; do not retry the same call unchanged.",
    )


def _checked_output(tool: Tool, produced: Produced, duration_ms: float) -> ToolResult:
    try:  # known types (datetime, Path, models, sets) convert; anything else is refused, not str()-ed
        jsonable = to_jsonable_python(produced.value)
        encoded = produced.encoded if produced.encoded is not None else json.dumps(jsonable)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        return ToolResult.failure(ErrorCode.INTERNAL, f"{tool.name} returned non-JSON output: {exc}", None, duration_ms)
    payloads = {ref["ref"]: content for ref, content in produced.artifacts}
    kept = [ref for ref, _ in produced.artifacts]
    if len(encoded) > tool.response_limit:
        if tool.large_output != "artifact":
            return ToolResult.failure(
                ErrorCode.RESPONSE_TOO_LARGE,
                f"{tool.name} returned {len(encoded)} characters, over its limit of {tool.response_limit}",
                "Ask for less: a narrower path, a smaller range, or a summary.",
                duration_ms,
            )
        content = encoded.encode()
        ref = content_ref(content)
        payloads[ref] = content
        kept.append({"ref": ref, "kind": "output", "size": len(content), "media_type": "application/json"})
        jsonable = artifact_view(tool.name, encoded, ref, tool.response_limit)
    return ToolResult(ok=True, output=jsonable, duration_ms=duration_ms, artifacts=kept).carrying(payloads)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
