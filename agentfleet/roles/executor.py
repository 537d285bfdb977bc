"""Executor: runs one tool call per event, write-ahead, never silently twice.

The policy is read first: a call a rule denies is answered PERMISSION_DENIED, and a
call that needs a person is parked (a row, and approval.requested) without running or
holding anything; the observer sends it again once answered, and the answer decides.
The intent is recorded before the tool runs. A redelivered call that finds an
unfinished intent knows an earlier attempt died mid-call: an idempotent tool runs
again; any other tool's outcome is UNKNOWN_OUTCOME, handed to the loop to resolve.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agentfleet import constants as C
from agentfleet.constants import DELEGATE_TOOL
from agentfleet.errors import AgentfleetError, ErrorCode, ToolError
from agentfleet.events.domain import event_id_for
from agentfleet.events.envelope import (
    ApprovalRequested,
    DelegationStarted,
    DomainEvent,
    Envelope,
    EventType,
    ToolFinished,
    ToolRequested,
)
from agentfleet.hooks.base import UNKNOWN_TOOL, ToolCallInfo
from agentfleet.loop.transcript import ToolResult
from agentfleet.redaction import redact
from agentfleet.roles import delegation
from agentfleet.roles.retry import CommitPending, InFlight, outcome_at_risk
from agentfleet.roles.step import Step
from agentfleet.store.records import ApprovalRecord, now
from agentfleet.tools.policy import Verdict, evaluate
from agentfleet.tools.tool import Tool, ToolContext

log = logging.getLogger(__name__)


def on_tool_requested(step: Step) -> list[Envelope]:
    req = step.env.body()
    assert isinstance(req, ToolRequested)
    store = step.rt.store
    key = req.idempotency_key
    with store.step_lock(key) as held:
        if not held:
            raise InFlight(f"tool step {key} is running elsewhere")
        cleared = _policy(step, req)
        if isinstance(cleared, list):
            return cleared  # parked for a person: nothing ran
        record = store.begin_step(
            key=key, run_id=step.env.run_id, iteration=req.iteration, kind="tool", call_id=req.call.id,
            name=req.call.name, input=cleared.arguments, worker=step.worker,
        )
        ran = False
        published: list[tuple[str, dict[str, Any]]] = []  # domain events the call published
        if record.status == DELEGATED:  # handed to a child run before: its Result will answer the call
            with store.tx() as conn:
                return step.commit(conn, [])
        delegating = (record.status == "started" and step.carried is None and cleared.answer is None
                      and _is_delegation(step, req))
        refused = _delegate(step, req, key, cleared.arguments) if delegating else None
        if isinstance(refused, list):
            return refused  # the child's goal is out; this call is answered when the child ends
        if refused is not None:
            result = refused
        elif record.status != "started":
            result = ToolResult.model_validate(record.output)  # finished before: never run it again
        elif step.carried is not None:
            result = ToolResult.model_validate(step.carried["tool_result"])  # ran before an outage: commit it
            published = [(n, p) for n, p in step.carried.get("published", [])]
            ran = True
        elif cleared.answer is not None:
            result = cleared.answer
        else:
            result, ran, published = _attempt(step, req, record.attempts, cleared.arguments)
            if cleared.approval is not None:
                result = result.model_copy(update={"approval": cleared.approval})
        finished = ToolFinished(
            agent=req.agent, iteration=req.iteration, call_id=req.call.id, tool=req.call.name,
            sibling_call_ids=req.sibling_call_ids, result=result, attempt=record.attempts, worker=step.worker,
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
                store.finish_step(conn, key, status="succeeded" if result.ok else "failed",
                                  output=result.model_dump(mode="json"), duration_ms=result.duration_ms)
                events = step.commit(conn, [event, *domain])
        except Exception as exc:
            if record.status == "started" and outcome_at_risk(exc):
                raise CommitPending({"tool_result": result.model_dump(mode="json"), "published": published},
                                    exc) from exc
            raise
        if record.status == "started":  # told once per call: when its result is first committed
            step.rt.hooks.after_tool(_call_info(step, req, record.attempts, ran), result)
        return events


DELEGATED = delegation.DELEGATED


def _is_delegation(step: Step, req: ToolRequested) -> bool:
    agent = step.rt.agent(req.agent)
    return req.call.name == DELEGATE_TOOL and agent is not None and bool(agent.delegates)


def _delegate(step: Step, req: ToolRequested, key: str, arguments: dict[str, Any]) -> ToolResult | list[Envelope]:
    """Start the child run (committed with the step marked delegated), or why it cannot start. The planner
    hands most delegations off itself; a call a policy parked for a person arrives here once approved."""
    store = step.rt.store
    agent = step.rt.agent(req.agent)
    parent = store.get_run(step.env.run_id)
    assert agent is not None
    if parent is None:
        raise AgentfleetError(f"delegation from run {step.env.run_id}, which is not in the store")
    refused = delegation.refusal(step, parent, agent, arguments)
    if refused is not None:
        return refused
    goal = delegation.child_goal(step, parent, req.iteration, req.call, req.sibling_call_ids, arguments)
    started = step.event(EventType.DELEGATION_STARTED, DelegationStarted(  # the parent may now wait
        agent=parent.agent, iteration=req.iteration, call_id=req.call.id, child_run_id=goal.run_id,
        sibling_call_ids=req.sibling_call_ids), key=(req.iteration, req.call.id, "delegated"))
    with store.tx() as conn:
        store.finish_step(conn, key, status=DELEGATED, output={"child_run_id": goal.run_id}, duration_ms=0.0)
        return step.commit(conn, [goal, started])


@dataclass(frozen=True)
class Cleared:
    """The call may go on: with these arguments (a person may have edited them), or answered without running."""

    arguments: dict[str, Any]
    answer: ToolResult | None = None
    approval: dict[str, Any] | None = None  # who approved it, their note, the edited arguments


def _policy(step: Step, req: ToolRequested) -> Cleared | list[Envelope]:
    """What the policy (or, for a call sent again after an answer, the answer) says; parked: its events."""
    store = step.rt.store
    if req.approval_id is not None:
        record = store.approval(req.approval_id)
        if record is None or record.pending:
            raise AgentfleetError(f"call {req.call.id} was sent on without an answer to its approval request")
        return _answered(record)
    agent = step.rt.agent(req.agent)
    tool = agent.tools.get(req.call.name) if agent else None
    if agent is None or tool is None:
        return Cleared(req.call.arguments)  # _attempt answers UNKNOWN_TOOL
    rules = (*agent.approval_rules, *step.rt.settings.rules)
    if not tool.requires_approval and not any(r.covers(tool.name) for r in rules):
        return Cleared(req.call.arguments)  # nothing to decide: the dispatch binds once, and runs what it bound
    try:
        # Rules decide on what will run: the values the tool receives once bound ("5e3" is 5000.0), not the
        # model's text; and those values, not the text, run.
        bound = tool.bound_json(req.call.arguments)
    except ToolError:
        return Cleared(req.call.arguments)  # the dispatch answers INVALID_ARGUMENTS: nothing runs
    verdict = evaluate(tool.name, bound, requires_approval=tool.requires_approval,
                       expires_s=tool.approval_expires_s, rules=rules)
    if verdict.action == "allow":
        return Cleared(bound)
    if verdict.action == "deny":
        return Cleared(bound, ToolResult.failure(
            ErrorCode.PERMISSION_DENIED, f"{tool.name} refused by policy ({verdict.rule}): {verdict.reason}",
            "Do not repeat this call as it is; change it or carry on without it."))
    return _park(step, req, tool, verdict, bound)


def _park(step: Step, req: ToolRequested, tool: Tool, verdict: Verdict,
          arguments: dict[str, Any]) -> Cleared | list[Envelope]:
    """Record the request (once per call) and announce it; a request already answered is acted on instead."""
    store, key = step.rt.store, req.idempotency_key
    expires_at = now() + timedelta(seconds=verdict.expires_s) if verdict.expires_s else None
    with store.tx() as conn:
        store.request_approval(
            conn, approval_id=key, run_id=step.env.run_id, iteration=req.iteration, call_id=req.call.id,
            agent=req.agent, tool=tool.name, arguments=arguments,
            shown=redact(arguments, tool.parameters), args_schema=tool.parameters,
            request=req.model_dump(mode="json"), rule=(verdict.rule or "")[:255], reason=(verdict.reason or "")[:1000],
            expires_at=expires_at,
        )
        record = store.approval(key, conn)
        assert record is not None
        if not record.pending:
            return _answered(record)
        event = step.event(EventType.APPROVAL_REQUESTED, ApprovalRequested(
            approval_id=key, agent=req.agent, iteration=req.iteration, call_id=req.call.id, tool=tool.name,
            sibling_call_ids=req.sibling_call_ids), key=(req.iteration, req.call.id, "approval"))
        log.info("call parked for approval", extra={"tool": tool.name, "rule": verdict.rule})
        return step.commit(conn, [event])


def _answered(record: ApprovalRecord) -> Cleared:
    """A person's answer (or its expiry) as the call's fate: run it, with any edits, or tell the model no."""
    if record.status == "approved":
        told = {"by": record.resolved_by, "note": record.note, "ran_with": record.edited_arguments}
        return Cleared(record.edited_arguments if record.edited_arguments is not None else record.arguments,
                       approval={k: v for k, v in told.items() if v is not None})
    if record.status == "expired":
        return Cleared(record.arguments, ToolResult.failure(
            ErrorCode.APPROVAL_EXPIRED, f"nobody answered the approval request for {record.tool} in time "
                                        f"({record.note})",
            "Carry on without this call, or try it again later."))
    return Cleared(record.arguments, ToolResult.failure(
        ErrorCode.APPROVAL_DENIED, f"{record.resolved_by} denied {record.tool}: {record.note or 'no reason given'}",
        "Do not repeat the call as it was; change it as the reason says, or carry on without it."))


def _call_info(step: Step, req: ToolRequested, attempt: int, ran: bool) -> ToolCallInfo:
    agent = step.rt.agent(req.agent)
    known = agent is not None and req.call.name in agent.tools
    return ToolCallInfo(run_id=step.env.run_id, agent=req.agent, tool=req.call.name if known else UNKNOWN_TOOL,
                        call_id=req.call.id, attempt=attempt, ran=ran, requested=req.call.name)


def _attempt(step: Step, req: ToolRequested, attempt: int, arguments: dict[str, Any]
             ) -> tuple[ToolResult, bool, list[tuple[str, dict[str, Any]]]]:
    """The call's result, whether the tool was handed to the runner for it, and the domain events it published
    (those it tried to publish against their schema are dead-lettered here, with the reason)."""
    settings = step.rt.settings
    agent = step.rt.agent(req.agent)
    tool = agent.tools.get(req.call.name) if agent else None
    if tool is None:
        offered = sorted(agent.tools) if agent else []
        return ToolResult.failure(ErrorCode.UNKNOWN_TOOL, f"no tool named {req.call.name!r}",
                                  f"Use one of: {', '.join(offered) or '(none)'}."), False, []
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
