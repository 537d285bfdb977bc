"""One handling of one event by one role (``Step``), and how a role ends a run.

What is common to every handler: commit the handling's dedupe mark with its outbox,
derive the ids of the events it causes, end a run with its Result. The Celery side
(decode, retry, dead-letter) is ``workers/event_task.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Connection

from agentfleet.events.contracts import Result, ResultStatus
from agentfleet.events.envelope import Envelope, EventType, RunEnded, stored_outbox
from agentfleet.loop.keys import derived_event_id
from agentfleet.loop.states import RunState
from agentfleet.roles.runtime import Runtime
from agentfleet.store.base import AlreadyHandled, RunMovedOn
from agentfleet.store.records import RunRecord

log = logging.getLogger(__name__)


@dataclass
class Step:
    """One handling of one event by one role."""

    rt: Runtime
    env: Envelope
    role: str
    worker: str
    redelivered: bool = False
    carried: dict[str, Any] | None = None  # an outcome an earlier attempt knew but could not commit
    # Known to be the message's first delivery, and no retry: the broker marks redeliveries, and this is not one.
    # No earlier attempt at it can have crashed its worker.
    first_delivery: bool = False
    _body: BaseModel | None = field(default=None, init=False, repr=False, compare=False)

    def body(self) -> BaseModel:
        """The event's payload as its typed model, validated once per handling (MalformedEvent if it does not
        fit)."""
        if self._body is None:
            self._body = self.env.body()
        return self._body

    def commit(self, conn: Connection, events: list[Envelope]) -> list[Envelope]:
        """Mark the event handled, storing what it produced, in the caller's transaction. If it was handled before,
        the transaction fails with ``AlreadyHandled`` (and the earlier handling's events are the ones to publish):
        found when the mark is written, not read before every handling (a duplicate is rare, and every handler is
        safe to run again: steps are checkpointed, transitions compare-and-set)."""
        store = self.rt.store
        if not store.mark_processed(conn, self.env.event_id, self.role, stored_outbox(events), run_id=self.env.run_id,
                                    deferred=True):
            raise AlreadyHandled()
        store.release_held(conn)  # the handling's step lock goes with this, its last commit
        return events

    def event(self, type: EventType, payload: Any, *, key: tuple[object, ...]) -> Envelope:
        """An event caused by this one, with an id derived from the run and ``key`` (stable on re-runs)."""
        return Envelope.new(
            type, self.env.run_id, payload, trace_id=self.env.trace_id, causation_id=self.env.event_id,
            event_id=derived_event_id(self.env.run_id, type, *key),
        )

    def locked_run(self, fresh: Callable[[RunRecord], bool], then: Callable[[Connection, RunRecord], list[Envelope]],
                   *, first: Callable[[Connection], None] | None = None,
                   stale: Callable[[RunRecord | None], None] | None = None,
                   known: RunRecord | None = None) -> list[Envelope]:
        """One transaction holding the run's row: ``then`` when the run is as this handling expects (``fresh``);
        else the handling is marked done with nothing to publish (an event about a run that has moved on, or ended,
        is late, not wrong). ``first`` writes what commits either way, before the run is read. ``known``: the run as
        this handling read it in an earlier transaction, held as read instead of read again (one round trip fewer,
        ``Store.hold_run``); if it changed since, that transaction is rolled back whole and this one runs again on
        the run read afresh. ``then`` must therefore leave nothing behind but what its transaction writes."""
        if known is not None:
            try:
                return self._locked_run(fresh, then, first, stale, known)
            except RunMovedOn:
                log.info("run changed since it was read: read again", extra={"run_id": known.run_id})
        return self._locked_run(fresh, then, first, stale, None)

    def _locked_run(self, fresh: Callable[[RunRecord], bool],
                    then: Callable[[Connection, RunRecord], list[Envelope]],
                    first: Callable[[Connection], None] | None, stale: Callable[[RunRecord | None], None] | None,
                    known: RunRecord | None) -> list[Envelope]:
        store = self.rt.store
        with store.tx() as conn:
            if first is not None:
                first(conn)
            run = store.get_run(self.env.run_id, conn, lock=True) if known is None else store.hold_run(conn, known)
            if run is None or not fresh(run):
                if stale is not None:
                    stale(run)
                return self.commit(conn, [])
            return then(conn, run)

    def run_ended(self, run_id: str, result: Result, *, redelivery: bool = False,
                  thread_id: str | None = None, lineage: dict[str, Any] | None = None) -> Envelope:
        return ended_event(run_id, self.env.trace_id, result, causation_id=self.env.event_id,
                           redelivery_of=self.env.event_id if redelivery else None, thread_id=thread_id,
                           lineage=lineage)


def ended_event(run_id: str, trace_id: str, result: Result, *, causation_id: str | None = None,
                redelivery_of: str | None = None, thread_id: str | None = None,
                lineage: dict[str, Any] | None = None) -> Envelope:
    """run.completed or run.failed carrying the Result. Its id is derived from the run, so however often a
    run is ended (a handler, the sweeper), one ending is one event; a later copy of the goal asking for the
    Result again (``redelivery_of``) gets an event of its own."""
    type = EventType.RUN_COMPLETED if result.status == ResultStatus.SUCCEEDED else EventType.RUN_FAILED
    payload = RunEnded(result=result.model_dump(mode="json"), redelivery=redelivery_of is not None,
                       thread_id=thread_id, lineage=lineage)
    event_id = (derived_event_id(redelivery_of, "redelivery") if redelivery_of
                else derived_event_id(run_id, type, "ended"))
    return Envelope.new(type, run_id, payload, trace_id=trace_id, causation_id=causation_id, event_id=event_id)


Handler = Callable[[Step], list[Envelope]]


TERMINAL_STATE = {
    ResultStatus.SUCCEEDED: RunState.SUCCEEDED,
    ResultStatus.FAILED: RunState.FAILED,
    ResultStatus.CANCELLED: RunState.CANCELLED,
}


def end_run(step: Step, conn: Connection, run: RunRecord, result: Result, **fields: Any) -> list[Envelope]:
    """Move a live run to the terminal state its Result names, storing the Result, in ``conn``'s transaction."""
    stored = result.model_dump(mode="json")
    if not step.rt.store.transition(conn, run, TERMINAL_STATE[result.status], result=stored,
                                    error_code=result.error_code, **fields):
        return step.commit(conn, [])
    return step.commit(conn, [step.run_ended(run.run_id, result, thread_id=run.thread_id, lineage=run.lineage)])


def result_of(run: RunRecord, **fields: Any) -> Result:
    """A run's public Result with its usage filled in."""
    return Result(run_id=run.run_id, goal_id=run.goal_id, agent=run.agent, usage=run.usage_summary(), **fields)
