"""Answering approval requests: from the inbox, the CLI and the expiry timer, one way.

An answer is a compare-and-set on the request's row (the first answer wins; a
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
from datetime import datetime, timedelta

from agentfleet.constants import APPROVAL_SEND_GRACE_S
from agentfleet.errors import ApprovalRefused, ErrorCode
from agentfleet.events.contracts import ApprovalAnswer, ApprovalNotice, ApprovalResolve, Decision
from agentfleet.events.envelope import ApprovalResolved, Envelope, EventType
from agentfleet.loop.decisions import schema_errors
from agentfleet.loop.keys import derived_event_id
from agentfleet.loop.states import is_terminal
from agentfleet.roles.runtime import Runtime
from agentfleet.store.records import ApprovalRecord, now

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
        if answer.arguments is not None:
            problems = schema_errors(record.args_schema, answer.arguments)
            if problems:
                raise ApprovalRefused(f"edited arguments break {record.tool}'s schema: {'; '.join(problems)}; the "
                                      "request stays pending", code=ErrorCode.INVALID_ARGUMENTS)
        if not store.resolve_approval(conn, record.approval_id, status=decision, by=by, note=answer.note,
                                      edited_arguments=answer.arguments):
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
    """Expire what has waited too long and send answers nobody acted on; (expired, re-sent)."""
    at = at or now()
    with rt.store.step_lock(APPROVALS_LOCK) as claimed:
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
