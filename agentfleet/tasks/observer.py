"""Observer: fans tool results in, and speaks to the outside world when a run ends.

Results of one iteration arrive in any order on any observer; the run row's
lock serialises them, so exactly one handling sees the set complete.
"""

from __future__ import annotations

import logging

from agentfleet.errors import RECOVERY_SUGGESTIONS, ErrorCode
from agentfleet.events.contracts import Result, ResultStatus, ToolHealthNotice
from agentfleet.events.envelope import (
    Envelope,
    EventType,
    Observation,
    ObservationRecorded,
    RunCancelRequested,
    RunEnded,
    ToolFinished,
    ToolHealthChanged,
)
from agentfleet.loop.decisions import fan_in_complete
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.loop.transcript import ToolResult
from agentfleet.tasks.base import Step, end_run, result_of

log = logging.getLogger(__name__)


def on_tool_finished(step: Step) -> list[Envelope]:
    done = step.env.body()
    assert isinstance(done, ToolFinished)
    store = step.rt.store
    with store.tx() as conn:
        run = store.get_run(step.env.run_id, conn, lock=True)
        if run is None or run.state != RunState.EXECUTING or run.iteration != done.iteration:
            log.info("late tool result ignored", extra={"call_id": done.call_id, "state": run and run.state})
            return step.commit(conn, [])
        store.record_observation(conn, run_id=run.run_id, iteration=done.iteration, call_id=done.call_id,
                                 tool=done.tool, result=done.result.model_dump(mode="json"))
        received = {o["call_id"]: o for o in store.observations(conn, run.run_id, done.iteration)}
        if not fan_in_complete(done.sibling_call_ids, received):
            return step.commit(conn, [])
        if not store.transition(conn, run, RunState.OBSERVING):
            return step.commit(conn, [])
        observations = [
            Observation(call_id=cid, tool=received[cid]["tool"],
                        result=ToolResult.model_validate(received[cid]["result"]))
            for cid in done.sibling_call_ids
        ]
        event = step.event(
            EventType.OBSERVATION_RECORDED,
            ObservationRecorded(agent=run.agent, iteration=done.iteration, observations=observations),
            key=(done.iteration, "observation"),
        )
        return step.commit(conn, [event])


def on_cancel_requested(step: Step) -> list[Envelope]:
    cancel = step.env.body()
    assert isinstance(cancel, RunCancelRequested)
    store = step.rt.store
    with store.tx() as conn:
        run = store.get_run(step.env.run_id, conn, lock=True)
        if run is None or is_terminal(run.state):
            return step.commit(conn, [])
        result = result_of(run, status=ResultStatus.CANCELLED, error_code=ErrorCode.CANCELLED, message=cancel.reason,
                           recovery_suggestion=RECOVERY_SUGGESTIONS[ErrorCode.CANCELLED])
        return end_run(step, conn, run, result)


def on_run_ended(step: Step) -> list[Envelope]:
    """Deliver the Result: to every reply_to that asked for it, and to the public exchange."""
    ended = step.env.body()
    assert isinstance(ended, RunEnded)
    store, publisher = step.rt.store, step.rt.publisher
    result = Result.model_validate(ended.result)
    pending = store.pending_replies(step.env.run_id)
    for _id, reply_to, correlation_id in pending:
        publisher.reply(reply_to, correlation_id or None, result)
    if not ended.redelivery:
        publisher.publish_public(str(step.env.type), ended.result, step.env.run_id)
    with store.tx() as conn:
        store.mark_replied(conn, [p[0] for p in pending])
        return step.commit(conn, [])


def on_tool_health_changed(step: Step) -> list[Envelope]:
    """Keep the transition and mirror it on the public exchange for dashboards and pagers."""
    change = step.env.body()
    assert isinstance(change, ToolHealthChanged)
    store, publisher = step.rt.store, step.rt.publisher
    notice = ToolHealthNotice(tool=change.tool, kind=change.kind, status=change.status, detail=change.detail,
                              time=change.at, by=change.by)
    publisher.publish_json(publisher.topology.public, notice.type, notice.model_dump(mode="json"),
                           declare=[publisher.topology.public])
    with store.tx() as conn:
        store.record_health_change(conn, event_id=step.env.event_id, tool=change.tool, kind=change.kind,
                                   status=change.status, detail=change.detail, by=change.by, occurred_at=change.at)
        return step.commit(conn, [])
