"""Approvals, every path in one place: the policy's verdict on a call (the executor's, and the planner's before
it hands a delegation off), parking a call for a person, the run waiting on it, the answer (from the inbox, the
CLI or the expiry timer, one way) and the parked call sent on with it.

A call the policy sends to a person is parked: a row, and ``approval.requested``,
without running or holding anything; the run waits (WAITING_APPROVAL) once nothing
else of its iteration runs. An answer is a compare-and-set on the request's row (the first answer wins; a
second gets a clear refusal), then an ``approval.resolved`` event with an id derived
from the request, so however often an answer is delivered or re-sent, the observer
acts on it once. The row is the truth: if the event is lost (a crash between the two,
or the CLI beside an embedded fleet, whose in-memory broker no other process can
reach), the observers' timer finds the answer not yet acted on and sends it: within seconds when
its publish was never confirmed (``sent_at`` is set only after the broker's confirm, so an
answerer killed between its commit and its publish leaves it null), and again only after
``AGENTFLEET_STALL_AFTER_S`` when it was (it may simply wait in a long queue; re-sending every
tick turned a backlog into a flood of duplicates).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from agentfleet.agents.registry import Agent
from agentfleet.errors import AgentfleetError, ApprovalRefused, ErrorCode, MalformedEvent, ToolError
from agentfleet.events.contracts import ApprovalAnswer, ApprovalNotice, ApprovalResolve, Decision
from agentfleet.events.envelope import (
    ApprovalRequested,
    ApprovalResolved,
    Envelope,
    EventType,
    ToolRequested,
)
from agentfleet.loop.decisions import schema_errors, waits_on_people
from agentfleet.loop.keys import derived_event_id
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.loop.transcript import ToolResult
from agentfleet.redaction import redact, unmasked
from agentfleet.roles import step_notices
from agentfleet.roles.retry import InFlight
from agentfleet.roles.runtime import Runtime
from agentfleet.roles.step import Step
from agentfleet.store.records import ApprovalRecord, RunRecord, now
from agentfleet.tools.policy import Verdict, evaluate
from agentfleet.tools.tool import Tool

# An answer whose approval.resolved is not yet confirmed sent gets this long (its own publish is under
# way) before the timer sends it; one confirmed sent is sent again only after the stall time.
APPROVAL_SEND_GRACE_S = 2.0


log = logging.getLogger(__name__)
APPROVALS_LOCK = "agentfleet/approvals"  # one expiry pass at a time, fleet-wide
EXPIRER = "agentfleet (expired)"


def resolve(rt: Runtime, answer: ApprovalResolve, by: str, *, publish: bool = True) -> ApprovalAnswer:
    """Record a person's answer, or raise ApprovalRefused saying why it cannot be taken."""
    decision: Decision = "approved" if answer.decision == "approve" else "denied"
    if answer.arguments is not None and decision != "approved":
        raise ApprovalRefused("only an approval may carry edited arguments", code=ErrorCode.INVALID_ARGUMENTS)
    store = rt.store
    with store.tx() as conn:
        record = store.approval_for_call(conn, answer.run_id, answer.call_id)
        if record is None:
            raise ApprovalRefused(f"no approval was requested for call {answer.call_id!r} of run {answer.run_id}",
                                  code=ErrorCode.UNKNOWN_APPROVAL)
        run = store.get_run(record.run_id, conn)
        _check_open(record, run.state if run else None)
        if run is not None and run.past_deadline():
            # The run is over in all but name (the sweeper ends it DEADLINE): nothing may run for it now.
            at = run.deadline_at().isoformat(timespec="seconds")
            raise ApprovalRefused(f"run {run.run_id} passed its deadline at {at}; nothing runs for it any more",
                                  code=ErrorCode.APPROVAL_NOT_PENDING)
        if decision == "approved" and record.expires_at is not None and record.expires_at <= now():
            raise ApprovalRefused(f"the request expired at {record.expires_at.isoformat(timespec='seconds')}",
                                  code=ErrorCode.APPROVAL_NOT_PENDING)
        edited = None
        if answer.arguments is not None:
            # Every answerer saw the arguments masked: a mask left in place keeps the secret the model sent.
            edited = unmasked(answer.arguments, record.shown, record.arguments)
            problems = schema_errors(record.args_schema, edited)
            if problems:
                raise ApprovalRefused(f"edited arguments break {record.tool}'s schema: {'; '.join(problems)}; the "
                                      "request stays pending", code=ErrorCode.INVALID_ARGUMENTS)
        if not store.resolve_approval(conn, record.approval_id, status=decision, by=by, note=answer.note,
                                      edited_arguments=edited):
            raise ApprovalRefused("answered by someone else a moment ago", code=ErrorCode.APPROVAL_NOT_PENDING)
        trace_id = run.trace_id if run else record.run_id
    if publish:
        _send(rt, record, decision, trace_id)
    log.info("approval answered", extra={"run_id": record.run_id, "call_id": record.call_id, "decision": decision,
                                         "by": by})
    return ApprovalAnswer(status="accepted", run_id=record.run_id, call_id=record.call_id, decision=decision, by=by)


def _check_open(record: ApprovalRecord, run_state: str | None) -> None:
    if not record.pending:
        at = record.resolved_at.isoformat(timespec="seconds") if record.resolved_at else "?"
        raise ApprovalRefused(f"already {record.status} by {record.resolved_by} at {at}",
                              code=ErrorCode.APPROVAL_NOT_PENDING)
    if run_state is None or is_terminal(run_state):
        raise ApprovalRefused(f"run {record.run_id} has ended ({run_state}); nothing waits for this answer",
                              code=ErrorCode.APPROVAL_NOT_PENDING)


def resolution_event(record: ApprovalRecord, decision: Decision, trace_id: str) -> Envelope:
    """approval.resolved for a request: its id derives from the request, so every copy is one event."""
    payload = ApprovalResolved(approval_id=record.approval_id, iteration=record.iteration, call_id=record.call_id,
                               decision=decision)
    return Envelope.new(EventType.APPROVAL_RESOLVED, record.run_id, payload, trace_id=trace_id,
                        event_id=derived_event_id(record.run_id, EventType.APPROVAL_RESOLVED, record.approval_id))


def _send(rt: Runtime, record: ApprovalRecord, decision: Decision, trace_id: str) -> bool:
    """Publish approval.resolved and record that it went; on failure the timer sends it."""
    try:
        rt.publisher.publish([resolution_event(record, decision, trace_id)])
        rt.store.mark_sent(record.approval_id, now())
        return True
    except Exception as exc:  # the answer is recorded: the observers' timer sends it
        log.warning("approval.resolved not published (%s); the approvals timer will send it", exc,
                    extra={"run_id": record.run_id, "call_id": record.call_id})
        return False


def notice(record: ApprovalRecord, *, as_requested: bool = False) -> ApprovalNotice:
    """The public face of a request: as it was asked (``approval.requested``) or as answered."""
    answered = not record.pending and not as_requested
    return ApprovalNotice(
        type="approval.resolved" if answered else "approval.requested", run_id=record.run_id,
        call_id=record.call_id, iteration=record.iteration, agent=record.agent, tool=record.tool,
        arguments=record.shown, rule=record.rule, reason=record.reason, requested_at=record.requested_at,
        expires_at=record.expires_at,
        **({"decision": record.status, "by": record.resolved_by, "at": record.resolved_at, "note": record.note,
            "edited": record.edited_arguments is not None} if answered else {}),
    )


def tick(rt: Runtime, at: datetime | None = None) -> tuple[int, int]:
    """Expire what has waited too long and send answers nobody acted on; (expired, re-sent).

    Every observer looks every ``approval_poll_s``, most often to find nothing: the look is one handling (one pooled
    connection for the fleet-wide lock, both reads and any expiry), not a connection for each."""
    at = at or now()
    with rt.store.handling(), rt.store.step_lock(APPROVALS_LOCK) as claimed:
        if not claimed:
            return 0, 0
        expired = 0
        for record in rt.store.expired_approvals(at):
            waited = (at - record.requested_at).total_seconds()
            with rt.store.tx() as conn:
                run = rt.store.get_run(record.run_id, conn)
                done = rt.store.resolve_approval(conn, record.approval_id, status="expired", by=EXPIRER,
                                                 note=f"no answer within {waited:.0f}s", edited_arguments=None, at=at)
            if done and run is not None:
                expired += 1
                log.info("approval expired", extra={"run_id": record.run_id, "call_id": record.call_id})
                _send(rt, record, "expired", run.trace_id)
        unapplied = rt.store.unapplied_approvals(at - timedelta(seconds=APPROVAL_SEND_GRACE_S),
                                                 at - timedelta(seconds=rt.settings.stall_after_s))
        sent = sum(_send(rt, record, record.status, trace_id)  # type: ignore[arg-type]
                   for record, trace_id in unapplied)
        return expired, sent


@dataclass(frozen=True)
class Cleared:
    """The call may go on: with these arguments (a person may have edited them), or answered without running."""

    arguments: dict[str, Any]
    answer: ToolResult | None = None
    approval: dict[str, Any] | None = None  # who approved it, their note, the edited arguments


def policy_verdict(step: Step, agent: Agent, tool: Tool, arguments: dict[str, Any]
                   ) -> tuple[dict[str, Any], Verdict | None]:
    """What the policy says of a call, decided on what will run: the values the tool receives once bound
    ("5e3" is 5000.0), not the model's text; and those values, not the text, run. No verdict when there is
    nothing to decide (no rule covers the tool and it asks for no approval: the dispatch binds once, and runs
    what it bound) or when the arguments do not bind (answered INVALID_ARGUMENTS where it would run: nothing
    runs); the arguments are then the model's. The executor and the planner's delegation hand-off both ask this."""
    rules = (*agent.approval_rules, *step.rt.settings.rules)
    if not tool.requires_approval and not any(r.covers(tool.name) for r in rules):
        return arguments, None
    try:
        bound = tool.bound_json(arguments)
    except ToolError:
        return arguments, None
    return bound, evaluate(tool.name, bound, requires_approval=tool.requires_approval,
                           expires_s=tool.approval_expires_s, rules=rules)


def clear(step: Step, req: ToolRequested, mine: Callable[[], bool] = lambda: True) -> Cleared | list[Envelope]:
    """What the policy (or, for a call sent again after an answer, the answer) says; parked: its events. ``mine``:
    whether the step is this handling's (its lock), asked before anything is written (InFlight if not)."""
    store = step.rt.store
    if req.approval_id is not None:
        record = store.approval(req.approval_id)
        if record is None or record.pending:
            raise AgentfleetError(f"call {req.call.id} was sent on without an answer to its approval request")
        return _answered(record)
    agent = step.rt.agent(req.agent)
    tool = agent.tool(req.call.name) if agent else None
    if agent is None or tool is None:
        return Cleared(req.call.arguments)  # the executor answers UNKNOWN_TOOL
    bound, verdict = policy_verdict(step, agent, tool, req.call.arguments)
    if verdict is None or verdict.action == "allow":
        return Cleared(bound)
    if verdict.action == "deny":
        return Cleared(bound, ToolResult.failure(
            ErrorCode.PERMISSION_DENIED, f"{tool.name} refused by policy ({verdict.rule}): {verdict.reason}",
            "Do not repeat this call as it is; change it or carry on without it."))
    if not mine():
        raise InFlight(f"tool step {req.idempotency_key} is running elsewhere")
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


def wait_if_parked(step: Step, conn: Connection, run: RunRecord, expected: list[str], received: Iterable[str]
                    ) -> None:
    """EXECUTING → WAITING_APPROVAL once every call still out is parked (other calls were never held back).
    An agent none of whose calls can be parked costs no query (an agent this observer does not load might)."""
    if run.state != RunState.EXECUTING:
        return
    agent = step.rt.agent(run.agent)
    if agent is not None and not agent.asks_approval and not step.rt.settings.rules:
        return
    if waits_on_people(expected, received, step.rt.store.parked_calls(conn, run.run_id, run.iteration)):
        moved = step.rt.store.transition(conn, run, RunState.WAITING_APPROVAL)
        step_notices.waiting(step, conn, run, "approval", moved)


def on_approval_requested(step: Step) -> list[Envelope]:
    """Announce the request on the public exchange; the run waits once nothing else of its iteration runs."""
    asked = step.body()
    assert isinstance(asked, ApprovalRequested)
    store, publisher = step.rt.store, step.rt.publisher
    record = store.approval(asked.approval_id)
    if record is not None:
        body = notice(record, as_requested=True)
        publisher.publish_json(publisher.topology.public, body.type, body.model_dump(mode="json"),
                               declare=[publisher.topology.public])

    def wait(conn: Connection, run: RunRecord) -> list[Envelope]:
        received = [o["call_id"] for o in store.observations(conn, run.run_id, asked.iteration)]
        wait_if_parked(step, conn, run, asked.sibling_call_ids, received)
        return step.commit(conn, [])

    return step.locked_run(lambda run: run.iteration == asked.iteration, wait)


def on_approval_resolved(step: Step) -> list[Envelope]:
    """Announce the answer and send the parked call on: the executor runs it (approved, maybe with edited
    arguments) or answers the model APPROVAL_DENIED / APPROVAL_EXPIRED, and its result fans in as usual."""
    answered = step.body()
    assert isinstance(answered, ApprovalResolved)
    store, publisher = step.rt.store, step.rt.publisher
    record = store.approval(answered.approval_id)
    if record is None or record.pending:
        raise MalformedEvent(f"approval.resolved for {answered.approval_id}, which has no answer recorded")
    body = notice(record)
    publisher.publish_json(publisher.topology.public, body.type, body.model_dump(mode="json"),
                           declare=[publisher.topology.public])

    def send_on(conn: Connection, run: RunRecord) -> list[Envelope]:
        if run.state == RunState.WAITING_APPROVAL:
            store.transition(conn, run, RunState.EXECUTING)
        request = ToolRequested.model_validate({**record.request, "approval_id": record.approval_id})
        event = step.event(EventType.TOOL_REQUESTED, request, key=(record.iteration, record.call_id, "answered"))
        return step.commit(conn, [event])

    # stale: the run ended (cancelled, past its deadline) while it waited
    return step.locked_run(lambda run: not is_terminal(run.state) and run.iteration == record.iteration, send_on,
                           first=lambda conn: store.mark_applied(conn, record.approval_id))
