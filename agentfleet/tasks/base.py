"""The one flow every event task follows.

decode → already handled? republish what that handling produced → else run the
role's handler (which commits its writes, its dedupe mark and its outbox in one
transaction) → publish the outbox → return, and Celery acks (acks_late).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Task
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from agentfleet.errors import BrokerError, ErrorCode, MalformedEvent
from agentfleet.events.contracts import Result, ResultStatus
from agentfleet.events.envelope import Envelope, EventType, RunEnded, decode
from agentfleet.logs import log_context
from agentfleet.loop.keys import derived_event_id
from agentfleet.loop.states import RunState
from agentfleet.store.repository import RunRecord
from agentfleet.tasks.runtime import Runtime, runtime_for

log = logging.getLogger(__name__)


class InFlight(Exception):
    """Another worker holds this step right now; leave it to that worker (its message stays unacked)."""


@dataclass
class Step:
    """One handling of one event by one role."""

    rt: Runtime
    env: Envelope
    role: str
    worker: str
    redelivered: bool = False

    def commit(self, conn: Connection, events: list[Envelope]) -> list[Envelope]:
        """Mark the event handled, storing what it produced, in the caller's transaction."""
        if not self.rt.store.mark_processed(conn, self.env.event_id, self.role, [e.wire() for e in events]):
            raise InFlight(f"{self.env.event_id} was handled concurrently")
        return events

    def event(self, type: EventType, payload: Any, *, key: tuple[object, ...]) -> Envelope:
        """An event caused by this one, with an id derived from the run and ``key`` (stable on re-runs)."""
        return Envelope.new(
            type, self.env.run_id, payload, trace_id=self.env.trace_id, causation_id=self.env.event_id,
            event_id=derived_event_id(self.env.run_id, type, *key),
        )

    def run_ended(self, run_id: str, result: Result, *, redelivery: bool = False) -> Envelope:
        failed = result.status != "succeeded"
        type = EventType.RUN_FAILED if failed else EventType.RUN_COMPLETED
        payload = RunEnded(result=result.model_dump(mode="json"), redelivery=redelivery)
        if redelivery:
            return Envelope.new(type, run_id, payload, trace_id=self.env.trace_id, causation_id=self.env.event_id,
                                event_id=derived_event_id(self.env.event_id, "redelivery"))
        return self.event(type, payload, key=("ended",))


Handler = Callable[[Step], list[Envelope]]


class EventTask(Task):
    """Base of every event task: acks late, retries what is transient, dead-letters the rest."""

    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    autoretry_for = (OperationalError, BrokerError)
    retry_backoff = 0.5
    retry_backoff_max = 10
    max_retries = 8
    role: str = ""
    handler: Handler | None = None


def run_event(task: EventTask, raw: Any) -> str:
    rt = runtime_for(task.app)
    try:
        env = decode(raw)
        if env.type != task.name:
            raise MalformedEvent(f"envelope type {env.type} arrived as task {task.name}")
        env.body()
    except MalformedEvent as exc:
        rt.publisher.dead_letter(
            json.dumps(raw, default=str).encode(), reason=str(exc), error_code=ErrorCode.MALFORMED_EVENT,
            source=f"task:{task.name}",
        )
        return "dead-lettered"
    assert task.handler is not None
    with log_context(run_id=env.run_id, trace_id=env.trace_id, event_id=env.event_id, event=str(env.type)):
        stored = rt.store.processed_outbox(env.event_id, task.role)
        if stored is not None:
            rt.publisher.publish(decode(e) for e in stored)
            log.info("duplicate event: republished its stored outcome", extra={"events": len(stored)})
            return "duplicate"
        step = Step(rt, env, task.role, task.request.hostname or "unknown",
                    bool((task.request.delivery_info or {}).get("redelivered")))
        try:
            events = task.handler(step)
        except InFlight as exc:
            log.info("step in flight elsewhere; leaving it to its holder", extra={"detail": str(exc)})
            return "in-flight"
        rt.publisher.publish(events)
        return f"published {len(events)}"


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
    return step.commit(conn, [step.run_ended(run.run_id, result)])


def result_of(run: RunRecord, **fields: Any) -> Result:
    """A run's public Result with its usage filled in."""
    usage = {"steps": run.steps_used, "tokens": run.input_tokens + run.output_tokens, "cost_usd": run.cost_usd}
    return Result(run_id=run.run_id, goal_id=run.goal_id, agent=run.agent, usage=usage, **fields)
