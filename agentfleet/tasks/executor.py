"""Executor: runs one tool call per event, write-ahead, never silently twice.

The intent is recorded before the tool runs. A redelivered call that finds an
unfinished intent knows an earlier attempt died mid-call: an idempotent tool runs
again; any other tool's outcome is UNKNOWN_OUTCOME, handed to the loop to resolve.
"""

from __future__ import annotations

import logging

from agentfleet.errors import ErrorCode
from agentfleet.events.envelope import Envelope, EventType, ToolFinished, ToolRequested
from agentfleet.harness.tool import ToolContext
from agentfleet.loop.transcript import ToolResult
from agentfleet.tasks.base import Step
from agentfleet.tasks.retry import CommitPending, InFlight, outcome_at_risk

log = logging.getLogger(__name__)


def on_tool_requested(step: Step) -> list[Envelope]:
    req = step.env.body()
    assert isinstance(req, ToolRequested)
    store = step.rt.store
    key = req.idempotency_key
    with store.step_lock(key) as held:
        if not held:
            raise InFlight(f"tool step {key} is running elsewhere")
        record = store.begin_step(
            key=key, run_id=step.env.run_id, iteration=req.iteration, kind="tool", call_id=req.call.id,
            name=req.call.name, input=req.call.arguments, worker=step.worker,
        )
        if record.status != "started":
            result = ToolResult.model_validate(record.output)  # finished before: never run it again
        elif step.carried is not None:
            result = ToolResult.model_validate(step.carried["tool_result"])  # ran before an outage: commit it
        else:
            result = _attempt(step, req, record.attempts)
        finished = ToolFinished(
            agent=req.agent, iteration=req.iteration, call_id=req.call.id, tool=req.call.name,
            sibling_call_ids=req.sibling_call_ids, result=result, attempt=record.attempts, worker=step.worker,
        )
        event_type = EventType.TOOL_COMPLETED if result.ok else EventType.TOOL_FAILED
        event = step.event(event_type, finished, key=(req.iteration, req.call.id, "finished"))
        try:
            with store.tx() as conn:
                store.finish_step(conn, key, status="succeeded" if result.ok else "failed",
                                  output=result.model_dump(mode="json"), duration_ms=result.duration_ms)
                return step.commit(conn, [event])
        except Exception as exc:
            if record.status == "started" and outcome_at_risk(exc):
                raise CommitPending({"tool_result": result.model_dump(mode="json")}, exc) from exc
            raise


def _attempt(step: Step, req: ToolRequested, attempt: int) -> ToolResult:
    settings = step.rt.settings
    agent = step.rt.agent(req.agent)
    tool = agent.tools.get(req.call.name) if agent else None
    if tool is None:
        offered = sorted(agent.tools) if agent else []
        return ToolResult.failure(ErrorCode.UNKNOWN_TOOL, f"no tool named {req.call.name!r}",
                                  f"Use one of: {', '.join(offered) or '(none)'}.")
    if attempt > settings.max_step_attempts:
        step.rt.publisher.dead_letter_event(step.env, reason=f"{tool.name} crashed its worker {attempt - 1} times",
                                            error_code=ErrorCode.POISON_MESSAGE)
        return ToolResult.failure(
            ErrorCode.POISON_MESSAGE,
            f"{tool.name} crashed its worker {attempt - 1} times; not trying again",
            "Treat this tool as unavailable for this goal.",
        )
    if attempt > 1 and not tool.idempotent:
        log.warning("earlier attempt died mid-call; outcome unknown", extra={"tool": tool.name, "attempt": attempt})
        return ToolResult.failure(
            ErrorCode.UNKNOWN_OUTCOME,
            f"an earlier attempt of {tool.name} died mid-call; it may or may not have taken effect",
            "Check the outside system's state (the idempotency key is stable) before calling again.",
        )
    ctx = ToolContext(run_id=step.env.run_id, call_id=req.call.id, idempotency_key=req.idempotency_key,
                      workspace=settings.workspace, attempt=attempt)
    return step.rt.dispatch.call(tool, req.call.arguments, ctx)
