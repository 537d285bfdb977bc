"""The one flow every event task follows, and one Celery task per consumed event type (name = routing key =
event type).

decode → run the role's handler on one database connection held for the whole handling
(it commits its writes, its dedupe mark and its outbox in one transaction) → publish the
outbox → return, and Celery acks (acks_late). An event handled before is found by that
commit (the dedupe mark is there): nothing is changed and what the earlier handling
produced is published again.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from celery import Celery, Task

from agentfleet import constants as C
from agentfleet.errors import RECOVERY_SUGGESTIONS, AgentfleetError, ErrorCode, MalformedEvent
from agentfleet.events.contracts import Result, ResultStatus
from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted, decode
from agentfleet.events.publisher import task_reprs
from agentfleet.events.topology import CONSUMERS
from agentfleet.hooks.base import StepInfo
from agentfleet.logs import log_context
from agentfleet.loop.states import is_terminal
from agentfleet.redaction import redact
from agentfleet.roles.catalog import HANDLERS
from agentfleet.roles.retry import CommitPending, InFlight, is_transient, max_retries, retry_delay
from agentfleet.roles.runtime import runtime_for
from agentfleet.roles.step import Handler, Step, end_run, result_of
from agentfleet.store.base import AlreadyHandled

log = logging.getLogger(__name__)


# Transports that mark a message delivered before to a consumer that did not ack it: RabbitMQ, and kombu's Redis
# transport when it restores unacked messages. Elsewhere (an embedded fleet's in-memory broker) a message's first
# delivery cannot be told from the next.
REDELIVERY_MARKED = frozenset({"amqp", "amqps", "pyamqp", "redis", "rediss"})


@functools.lru_cache(maxsize=8)
def marks_redeliveries(broker_url: str) -> bool:
    """Whether a message's first delivery can be told from a redelivery on this broker (``Step.first_delivery``)."""
    return broker_url.partition("://")[0].lower() in REDELIVERY_MARKED


def was_redelivered(request: Any) -> bool:
    """Whether the message may have been delivered before: the broker's flag; the broker's move out of a process's
    own queue (``x-death``, ``events/topology.py``), which clears the flag although the process the message was in may
    have died handling it; or a copy sent again from a stored outbox (``HEADER_RESENT``), whose first copy may have.
    Counted so, a crash there is counted as any other (``max_step_attempts``)."""
    return (bool((request.delivery_info or {}).get("redelivered")) or bool(getattr(request, "x-death", None))
            or bool(getattr(request, C.HEADER_RESENT, None)))


class EventTask(Task):
    """Base of every event task: acks late, retries what is transient (tasks/retry.py), dead-letters the rest."""

    Strategy = "agentfleet.workers.strategy:fleet_strategy"
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
        redelivered = was_redelivered(task.request)
        step = Step(rt, env, task.role, task.request.hostname or "unknown", redelivered, carried,
                    first_delivery=not (redelivered or task.request.retries)
                    and marks_redeliveries(task.app.conf.broker_url or ""))
        step.body()  # validated here, once: the handler reads it from the step
    except MalformedEvent as exc:
        rt.publisher.dead_letter(
            json.dumps(raw, default=str).encode(), reason=str(exc), error_code=ErrorCode.MALFORMED_EVENT,
            source=f"task:{task.name}", original_exchange=rt.topology.events.name, original_routing_key=task.name,
        )
        return "dead-lettered"
    assert task.handler is not None
    info = StepInfo(role=task.role, event_type=str(env.type), event_id=env.event_id, run_id=env.run_id,
                    trace_id=env.trace_id, worker=step.worker, redelivered=step.redelivered)
    with log_context(run_id=env.run_id, trace_id=env.trace_id, event_id=env.event_id, event=str(env.type)), \
            rt.hooks.step(info) as watch:
        try:
            with rt.store.handling():
                events = task.handler(step)
            rt.publisher.publish(events)
        except AlreadyHandled:
            republished = _republish_outcome(step)
            log.info("duplicate event: republished its stored outcome", extra={"events": republished})
            watch.outcome = "duplicate"
            return "duplicate"
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


def _republish_outcome(step: Step) -> int:
    """Publish again what the handling that marked this event handled first produced (its stored outbox), marked as
    copies sent again (``Publisher.publish``'s ``resent``): how many events."""
    stored = step.rt.store.processed_outbox(step.env.event_id, step.role) or []
    step.rt.publisher.publish((decode(e) for e in stored), resent=True)
    return len(stored)


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
    raise task.retry(exc=AgentfleetError(redact(f"{type(exc).__name__}: {exc}")), countdown=delay, kwargs=kwargs,
                     **task_reprs(step.env))


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
    except AlreadyHandled:  # handled after all (by another delivery): its outcome stands
        _republish_outcome(step)
        return "dead-lettered"
    except Exception:
        log.exception("could not end the run after its step failed; the sweeper will find it")
        return "dead-lettered"
    if run is None and step.env.type == EventType.GOAL_SUBMITTED:
        goal = step.body()
        assert isinstance(goal, GoalSubmitted)
        if goal.reply_to:  # no run exists to carry the Result: answer the sender directly
            rt.publisher.reply(goal.reply_to, goal.correlation_id,
                               Result.rejection(code, reason[:2000], agent=goal.agent, goal_id=goal.goal_id))
    rt.publisher.publish(events)
    return "dead-lettered"


def register_tasks(app: Celery) -> None:
    for event_type, handler in HANDLERS.items():

        def task(self: EventTask, envelope: Any, carried: dict[str, Any] | None = None) -> str:
            return run_event(self, envelope, carried)

        task.__name__ = task.__qualname__ = str(event_type).replace(".", "_")
        task.__doc__ = f"Handle {event_type} ({CONSUMERS[event_type]} role)."
        app.task(name=str(event_type), bind=True, base=EventTask, shared=False,
                 handler=staticmethod(handler), role=CONSUMERS[event_type])(task)
