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

from agentfleet.errors import RECOVERY_SUGGESTIONS, AgentfleetError, ErrorCode, MalformedEvent
from agentfleet.events.contracts import Result, ResultStatus
from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted, RunEnded, decode
from agentfleet.harness.redaction import redact
from agentfleet.hooks.base import StepInfo
from agentfleet.logs import log_context
from agentfleet.loop.keys import derived_event_id
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.store.repository import RunRecord
from agentfleet.tasks.retry import CommitPending, InFlight, is_transient, max_retries, retry_delay
from agentfleet.tasks.runtime import Runtime, runtime_for

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

    def commit(self, conn: Connection, events: list[Envelope]) -> list[Envelope]:
        """Mark the event handled, storing what it produced, in the caller's transaction."""
        if not self.rt.store.mark_processed(conn, self.env.event_id, self.role, [e.wire() for e in events],
                                            run_id=self.env.run_id):
            raise InFlight(f"{self.env.event_id} was handled concurrently")
        return events

    def event(self, type: EventType, payload: Any, *, key: tuple[object, ...]) -> Envelope:
        """An event caused by this one, with an id derived from the run and ``key`` (stable on re-runs)."""
        return Envelope.new(
            type, self.env.run_id, payload, trace_id=self.env.trace_id, causation_id=self.env.event_id,
            event_id=derived_event_id(self.env.run_id, type, *key),
        )

    def run_ended(self, run_id: str, result: Result, *, redelivery: bool = False) -> Envelope:
        return ended_event(run_id, self.env.trace_id, result, causation_id=self.env.event_id,
                           redelivery_of=self.env.event_id if redelivery else None)


def ended_event(run_id: str, trace_id: str, result: Result, *, causation_id: str | None = None,
                redelivery_of: str | None = None) -> Envelope:
    """run.completed or run.failed carrying the Result. Its id is derived from the run, so however often a
    run is ended (a handler, the sweeper), one ending is one event; a later copy of the goal asking for the
    Result again (``redelivery_of``) gets an event of its own."""
    type = EventType.RUN_COMPLETED if result.status == ResultStatus.SUCCEEDED else EventType.RUN_FAILED
    payload = RunEnded(result=result.model_dump(mode="json"), redelivery=redelivery_of is not None)
    event_id = (derived_event_id(redelivery_of, "redelivery") if redelivery_of
                else derived_event_id(run_id, type, "ended"))
    return Envelope.new(type, run_id, payload, trace_id=trace_id, causation_id=causation_id, event_id=event_id)


Handler = Callable[[Step], list[Envelope]]


class EventTask(Task):
    """Base of every event task: acks late, retries what is transient (tasks/retry.py), dead-letters the rest."""

    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    max_retries = None  # unbounded for Celery: _retry_later bounds retries by time, per error
    role: str = ""
    handler: Handler | None = None


def run_event(task: EventTask, raw: Any, carried: dict[str, Any] | None = None) -> str:
    rt = runtime_for(task.app)
    try:
        env = decode(raw)
        if env.type != task.name:
            raise MalformedEvent(f"envelope type {env.type} arrived as task {task.name}")
        env.body()
    except MalformedEvent as exc:
        rt.publisher.dead_letter(
            json.dumps(raw, default=str).encode(), reason=str(exc), error_code=ErrorCode.MALFORMED_EVENT,
            source=f"task:{task.name}", original_exchange=rt.topology.events.name, original_routing_key=task.name,
        )
        return "dead-lettered"
    assert task.handler is not None
    step = Step(rt, env, task.role, task.request.hostname or "unknown",
                bool((task.request.delivery_info or {}).get("redelivered")), carried)
    info = StepInfo(role=task.role, event_type=str(env.type), event_id=env.event_id, run_id=env.run_id,
                    trace_id=env.trace_id, worker=step.worker, redelivered=step.redelivered)
    with log_context(run_id=env.run_id, trace_id=env.trace_id, event_id=env.event_id, event=str(env.type)), \
            rt.hooks.step(info) as watch:
        try:
            stored = rt.store.processed_outbox(env.event_id, task.role)
            if stored is not None:
                rt.publisher.publish(decode(e) for e in stored)
                log.info("duplicate event: republished its stored outcome", extra={"events": len(stored)})
                watch.outcome = "duplicate"
                return "duplicate"
            events = task.handler(step)
            rt.publisher.publish(events)
        except Exception as exc:
            if is_transient(exc):
                watch.outcome = "retried"
                outcome = _retry_later(task, step, exc)  # raises Celery's Retry, or gives up
            else:
                outcome = _failed_for_good(step, exc)
            watch.outcome = outcome
            return outcome
        watch.outcome = "published"
        return f"published {len(events)}"


def _retry_later(task: EventTask, step: Step, exc: Exception) -> str:
    """Hand the step back to the broker with a countdown: acked only once the copy is confirmed.

    A step held by a worker that has just died (its database session not yet closed) is
    the case this exists for: acking it as "someone else has it" lost the run.
    """
    settings = step.rt.settings
    attempt = task.request.retries or 0
    limit = max_retries(settings.step_retry_max_delay_s, settings.step_retry_window_s)
    if attempt >= limit:
        if isinstance(exc, InFlight):
            # Still held after the whole window: its holder is alive (a dead session's lock goes
            # with its connection) and its own message is unacked. The sweeper watches the run.
            log.warning("step still held after retrying; leaving it to its holder", extra={"detail": str(exc)})
            return "in-flight"
        return _failed_for_good(step, exc)
    delay = retry_delay(attempt, settings.step_retry_max_delay_s)
    log.info("step will be retried: %s", exc, extra={"retry_in_s": round(delay, 3), "retries": attempt,
                                                    "transient": type(exc).__name__})
    kwargs = {**(task.request.kwargs or {})}
    if isinstance(exc, CommitPending):
        kwargs["carried"] = exc.carry
    # Celery sends the exception to Flower (task-retried): its text, masked, not the original (a database
    # error quotes the statement's parameters, a tool's arguments among them).
    raise task.retry(exc=AgentfleetError(redact(f"{type(exc).__name__}: {exc}")), countdown=delay, kwargs=kwargs)


def _failed_for_good(step: Step, exc: Exception) -> str:
    """A bug or a message no retry will fix: keep the message with its reason, and end the run with a Result.

    Every goal the inbox admitted therefore ends with a Result, even when a later step refuses it.
    """
    code = exc.code if isinstance(exc, AgentfleetError) else ErrorCode.INTERNAL
    reason = f"{step.env.type} failed in the {step.role}: {type(exc).__name__}: {exc}"
    log.error("step failed for good", exc_info=exc, extra={"error_code": code})
    rt = step.rt
    rt.publisher.dead_letter_event(step.env, reason=reason, error_code=code)
    events: list[Envelope] = []
    try:
        with rt.store.tx() as conn:
            run = rt.store.get_run(step.env.run_id, conn, lock=True)
            if run is not None and not is_terminal(run.state):
                result = result_of(run, status=ResultStatus.FAILED, error_code=code, message=reason[:2000],
                                   recovery_suggestion=RECOVERY_SUGGESTIONS.get(code))
                events = end_run(step, conn, run, result)
            elif run is None:
                step.commit(conn, [])
    except Exception:
        log.exception("could not end the run after its step failed; the sweeper will find it")
        return "dead-lettered"
    if run is None and step.env.type == EventType.GOAL_SUBMITTED:
        goal = step.env.body()
        assert isinstance(goal, GoalSubmitted)
        if goal.reply_to:  # no run exists to carry the Result: answer the sender directly
            rt.publisher.reply(goal.reply_to, goal.correlation_id,
                               Result.rejection(code, reason[:2000], agent=goal.agent, goal_id=goal.goal_id))
    rt.publisher.publish(events)
    return "dead-lettered"


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
    return Result(run_id=run.run_id, goal_id=run.goal_id, agent=run.agent, usage=run.usage_summary(), **fields)
