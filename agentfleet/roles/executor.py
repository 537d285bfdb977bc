"""Executor: runs one tool call per event, write-ahead, never silently twice.

The policy is read first (``approvals``): a call a rule denies is answered
PERMISSION_DENIED, and a call that needs a person is parked without running or holding
anything; it is sent again once answered, and the answer decides. A ``delegate`` call
that arrives here starts its child run (``delegation``).
The intent is recorded before the tool runs. A redelivered call that finds an
unfinished intent knows an earlier attempt died mid-call: an idempotent tool runs
again; any other tool's outcome is UNKNOWN_OUTCOME, handed to the loop to resolve.
An idempotent tool's call on its message's first delivery writes nothing before it
runs: its step is written once, finished, with the commit (``intent_first``).
"""

from __future__ import annotations

import logging
from typing import Any

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from agentfleet.events.domain import event_id_for
from agentfleet.events.envelope import (
    DomainEvent,
    Envelope,
    EventType,
    ToolFinished,
    ToolRequested,
)
from agentfleet.hooks.base import UNKNOWN_TOOL, ToolCallInfo
from agentfleet.loop.recovery import CallResume, intent_first, resume_call
from agentfleet.loop.transcript import ToolResult
from agentfleet.roles import approvals, delegation, step_notices
from agentfleet.roles.retry import CommitPending, InFlight, outcome_at_risk
from agentfleet.roles.step import Step
from agentfleet.store.base import StepHold
from agentfleet.store.records import StepRecord, now
from agentfleet.tools.tool import Tool, ToolContext

log = logging.getLogger(__name__)


def on_tool_requested(step: Step) -> list[Envelope]:
    req = step.body()
    assert isinstance(req, ToolRequested)
    store = step.rt.store
    key = req.idempotency_key
    with store.step_lock(key) as held:
        # The policy is decided first (pure: nothing is written before the step is known to be this handling's);
        # the lock is then asked with the intent, in one statement (``begin_step``), unless parking asked it.
        cleared = approvals.clear(step, req, mine=lambda: bool(held))
        if isinstance(cleared, list):
            return cleared  # parked for a person: nothing ran
        tool, started_at = _tool_of(step, req), now()
        repeatable = tool is not None and tool.idempotent  # may run again with no harm: its intent need not be durable
        facts = dict(carried=step.carried is not None, answered=cleared.answer is not None,
                     delegation=delegation.is_delegation(step, req))
        record: StepRecord | None = None
        if intent_first(repeatable=repeatable, first_delivery=step.first_delivery, **facts,
                        timeout_s=tool.effective_timeout_s(step.rt.settings) if tool is not None else float("inf"),
                        stall_after_s=step.rt.settings.stall_after_s):
            # The intent must reach the disk before a call that may not run twice; a repeatable call's may not. A
            # redelivered repeatable call with no intent yet may follow a first attempt that wrote none and took its
            # worker down: counted as one (2 if the intent is new), so a call that crashes every worker is stopped
            # after the same number of crashes as any other.
            record = store.begin_step(
                key=key, run_id=step.env.run_id, iteration=req.iteration, kind="tool", call_id=req.call.id,
                name=req.call.name, input=cleared.arguments, worker=step.worker, durable=not repeatable, hold=held,
                attempts=2 if repeatable and step.redelivered else 1,
            )
            if record is None:
                raise InFlight(f"tool step {key} is running elsewhere")
            how = resume_call(status=record.status, delegated=delegation.DELEGATED, **facts)
        else:  # nothing written before it runs, and no holder: its step is written, finished, with the commit
            if isinstance(held, StepHold):
                held.forgo()
            how = CallResume.RUN
        attempt, first = (1, True) if record is None else (record.attempts, record.status == "started")
        ran = False
        published: list[tuple[str, dict[str, Any]]] = []  # domain events the call published
        if how is CallResume.CHILD_ANSWERS:
            with store.tx() as conn:
                return step.commit(conn, [])
        if how is CallResume.DELEGATE:
            started = delegation.delegate(step, req, key, cleared.arguments)
            if isinstance(started, list):
                return started  # the child's goal is out; this call is answered when the child ends
            result = started  # why the child could not start
        elif how is CallResume.STORED:
            assert record is not None
            result = ToolResult.model_validate(record.output)
        elif how is CallResume.CARRIED:
            assert step.carried is not None
            result = ToolResult.model_validate(step.carried["tool_result"])
            published = [(n, p) for n, p in step.carried.get("published", [])]
            ran = True
        elif how is CallResume.ANSWERED:
            assert cleared.answer is not None
            result = cleared.answer
        else:
            step_notices.tool_started(step, req.progress, req.agent, req.iteration, req.call.id, req.call.name)
            result, ran, published = _attempt(step, req, attempt, cleared.arguments)
            if cleared.approval is not None:
                result = result.model_copy(update={"approval": cleared.approval})
        finished = ToolFinished(
            agent=req.agent, iteration=req.iteration, call_id=req.call.id, tool=req.call.name,
            sibling_call_ids=req.sibling_call_ids, result=result, attempt=attempt, worker=step.worker,
            run_left=req.run_left, planner=req.planner, observer=req.observer,
        )
        event_type = EventType.TOOL_COMPLETED if result.ok else EventType.TOOL_FAILED
        event = step.event(event_type, finished, key=(req.iteration, req.call.id, "finished"))
        # Sent with the step's outcome, after it commits, with ids derived from the step: once, however often
        # the step is retried. A call that failed publishes nothing (its events go with it, as a rollback).
        domain = [step.event(EventType.DOMAIN_EVENT, DomainEvent(
            name=name, event_id=event_id_for(key, i), payload=payload, source="run", step_key=key),
            key=(req.iteration, req.call.id, "domain", i)) for i, (name, payload) in enumerate(published)
            if result.ok]
        try:
            with store.tx() as conn:
                if result.artifacts:
                    store.keep_artifacts(conn, run_id=step.env.run_id, call_id=req.call.id, tool=req.call.name,
                                         refs=result.artifacts, payloads=result.payloads())
                status, output = "succeeded" if result.ok else "failed", result.model_dump(mode="json")
                if record is None:
                    store.record_step(conn, key=key, run_id=step.env.run_id, iteration=req.iteration,
                                      call_id=req.call.id, name=req.call.name, input=cleared.arguments,
                                      worker=step.worker, status=status, output=output, started_at=started_at,
                                      duration_ms=result.duration_ms)
                else:
                    store.finish_step(conn, key, status=status, output=output, duration_ms=result.duration_ms)
                events = step.commit(conn, [event, *domain])
        except Exception as exc:
            if first and outcome_at_risk(exc):
                raise CommitPending({"tool_result": result.model_dump(mode="json"), "published": published},
                                    exc) from exc
            raise
        if first:  # told once per call: when its result is first committed
            step.rt.hooks.after_tool(_call_info(step, req, attempt, ran), result)
            step_notices.tool_finished(step, req.progress, req.agent, req.iteration, req.call.id, req.call.name,
                                       result)
        return events




def _tool_of(step: Step, req: ToolRequested) -> Tool | None:
    """The called tool, when the agent is loaded here and has one by that name."""
    agent = step.rt.agent(req.agent)
    return agent.tool(req.call.name) if agent else None


def _call_info(step: Step, req: ToolRequested, attempt: int, ran: bool) -> ToolCallInfo:
    known = _tool_of(step, req) is not None
    return ToolCallInfo(run_id=step.env.run_id, agent=req.agent, tool=req.call.name if known else UNKNOWN_TOOL,
                        call_id=req.call.id, attempt=attempt, ran=ran, requested=req.call.name)


def _attempt(step: Step, req: ToolRequested, attempt: int, arguments: dict[str, Any]
             ) -> tuple[ToolResult, bool, list[tuple[str, dict[str, Any]]]]:
    """The call's result, whether the tool was handed to the runner for it, and the domain events it published
    (those it tried to publish against their schema are dead-lettered here, with the reason)."""
    settings = step.rt.settings
    agent = step.rt.agent(req.agent)
    tool = _tool_of(step, req)
    if req.call.name == C.FINAL_ANSWER_TOOL:  # beside other calls of its turn (loop/decisions.py): not taken
        return ToolResult.failure(ErrorCode.NOT_RUN, f"{C.FINAL_ANSWER_TOOL} was called beside other tools, "
                                  "before their results were in, so it was not taken",
                                  f"Read the other calls' results, then call {C.FINAL_ANSWER_TOOL} alone."), False, []
    if tool is None:
        offered = sorted(agent.tools) if agent else []
        return ToolResult.failure(ErrorCode.UNKNOWN_TOOL, f"no tool named {req.call.name!r}",
                                  f"Use one of: {', '.join(offered) or '(none)'}."), False, []
    if tool.queue is not None and req.queue != tool.queue:  # the planner found nothing consuming its queue
        return ToolResult.failure(ErrorCode.TOOL_UNAVAILABLE, f"{tool.name} runs only on executors consuming queue "
                                  f"{tool.queue!r}, and none did when it was called",
                                  "Do without this tool for now, or try it again later."), False, []
    if attempt > settings.max_step_attempts:
        step.rt.publisher.dead_letter_event(step.env, reason=f"{tool.name} crashed its worker {attempt - 1} times",
                                            error_code=ErrorCode.POISON_MESSAGE)
        return ToolResult.failure(
            ErrorCode.POISON_MESSAGE,
            f"{tool.name} crashed its worker {attempt - 1} times; not trying again",
            "Treat this tool as unavailable for this goal.",
        ), False, []
    if attempt > 1 and not tool.idempotent:
        log.warning("earlier attempt died mid-call; outcome unknown", extra={"tool": tool.name, "attempt": attempt})
        return ToolResult.failure(
            ErrorCode.UNKNOWN_OUTCOME,
            f"an earlier attempt of {tool.name} died mid-call; it may or may not have taken effect",
            "Check the outside system's state (the idempotency key is stable) before calling again.",
        ), False, []
    run_id, stops, store = step.env.run_id, step.rt.stops, step.rt.store
    ctx = ToolContext(run_id=run_id, call_id=req.call.id, idempotency_key=req.idempotency_key,
                      workspace=settings.workspace, attempt=attempt, deadline_at=req.deadline_at,
                      cancel_check=lambda: stops.stopped(run_id),
                      heartbeat_sink=lambda details: stops.heartbeat(req.idempotency_key, details),
                      artifact=lambda ref, offset, length: store.artifact_part(run_id, ref, offset, length))
    step.rt.hooks.before_tool(_call_info(step, req, attempt, True))
    result = step.rt.dispatch.call(tool, arguments, ctx)
    for name, payload, why in ctx.refused:
        step.rt.publisher.dead_letter({"name": name, "payload": payload}, reason=f"domain event {name} refused: {why}",
                                      error_code=ErrorCode.INVALID_ARGUMENTS, source=f"tool:{tool.name}",
                                      original_routing_key=f"{C.DOMAIN_ROUTING_PREFIX}{name}")
    return result, True, list(ctx.published)
