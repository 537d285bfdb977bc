"""Runs one tool call and turns every way it can go wrong into a structured result.

A Python tool that hangs cannot be killed from inside its process; it runs in
its own daemon thread and is abandoned at its timeout (the model sees TIMEOUT).
Subprocess tools under a sandbox, which can be killed, are the harness's next step.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from agentfleet.errors import ErrorCode, ToolError
from agentfleet.harness.timeouts import call_with_timeout
from agentfleet.harness.tool import Tool, ToolContext
from agentfleet.loop.transcript import ToolResult

log = logging.getLogger(__name__)


def run_tool(tool: Tool, arguments: dict[str, Any], ctx: ToolContext, default_timeout_s: float) -> ToolResult:
    """Run one call; ``default_timeout_s`` applies when the tool declares no timeout of its own."""
    started = time.perf_counter()
    try:
        kwargs = tool.bind(arguments)
    except ToolError as exc:
        return ToolResult.failure(exc.code, exc.message, exc.hint, round((time.perf_counter() - started) * 1000, 3))
    return run_bound(tool, kwargs, ctx, default_timeout_s, started)


def run_bound(tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, default_timeout_s: float,
              started: float | None = None) -> ToolResult:
    """Run a call whose arguments ``Tool.bind`` has validated."""
    started = time.perf_counter() if started is None else started

    def elapsed() -> float:
        return round((time.perf_counter() - started) * 1000, 3)

    if tool.context_param:
        kwargs = {**kwargs, tool.context_param: ctx}

    timeout = tool.timeout_s or default_timeout_s
    called = call_with_timeout(lambda: tool.func(**kwargs), timeout, name=f"tool:{tool.name}:{ctx.call_id}")
    if not called.finished:
        return ToolResult.failure(
            ErrorCode.TIMEOUT,
            f"{tool.name} did not finish within {timeout:g}s",
            "The tool may be overloaded; try narrower arguments or another tool.",
            elapsed(),
        )
    if called.error is not None:
        return _failure_from(called.error, tool, ctx, elapsed())
    return _checked_output(tool, called.value, elapsed())


def _failure_from(exc: BaseException, tool: Tool, ctx: ToolContext, duration_ms: float) -> ToolResult:
    if isinstance(exc, ToolError):
        return ToolResult.failure(exc.code, exc.message, exc.hint, duration_ms)
    # The model gets a line; the operator gets the traceback (with the step's run, call and trace ids).
    log.error("tool %s raised %s", tool.name, type(exc).__name__, exc_info=exc,
              extra={"tool": tool.name, "run_id": ctx.run_id, "call_id": ctx.call_id})
    return ToolResult.failure(
        ErrorCode.INTERNAL,
        f"{tool.name} raised {type(exc).__name__}: {exc}",
        "This is a bug or outage in the tool; do not retry the same call unchanged.",
        duration_ms,
    )


def _checked_output(tool: Tool, output: Any, duration_ms: float) -> ToolResult:
    try:  # known types (datetime, Path, models, sets) convert; anything else is refused, not str()-ed
        jsonable = to_jsonable_python(output)
        encoded = json.dumps(jsonable)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        return ToolResult.failure(ErrorCode.INTERNAL, f"{tool.name} returned non-JSON output: {exc}", None, duration_ms)
    if len(encoded) > tool.response_limit:
        return ToolResult.failure(
            ErrorCode.RESPONSE_TOO_LARGE,
            f"{tool.name} returned {len(encoded)} characters, over its limit of {tool.response_limit}",
            "Ask for less: a narrower path, a smaller range, or a summary.",
            duration_ms,
        )
    return ToolResult(ok=True, output=jsonable, duration_ms=duration_ms)
