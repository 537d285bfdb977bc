"""How a worker takes an event task's message off its queue: the fleet's short way, or Celery's.

Celery hands every message to its task's *strategy* on the consumer's thread. The default builds a ``Request``
(thirty-odd attributes, parsed headers), reserves it, sends it to the pool wrapped in the tracer, which pushes the
task's context, runs it, classifies its outcome and hands the ``Request`` back for the ack. For the fleet's own
event tasks most of that does nothing: they have no ETA, expiry, rate limit, result or time limit that a thread pool
enforces, and their handling (``event_task.run_event``) answers its own errors with a Result or a dead letter.

``fleet_strategy`` takes such a message the short way: the pool runs ``_Handling.run``, which decodes the body,
pushes the same task context Celery's tracer would (``Request``'s request dict: the headers, the properties,
``delivery_info``, the hostname), runs the task and acks or rejects as the default would for the outcome:
returned, ``Retry`` (its copy is already published) and ``Ignore`` ack; ``Reject`` rejects as asked; an undecodable
body, or any other exception, is rejected without requeue, as ``FleetConsumer`` and
``task_acks_on_failure_or_timeout=False`` have it, so it reaches the queue's dead-letter exchange; a ``BaseException``
(``SystemExit``) sends the message back. ``inspect active`` and ``stats`` still count it (``worker.state``), and the
autoscaler still sees it (the consumer's per-message callbacks). Acks go through the consumer's own promises, on the
consumer's thread, as Celery's do.

A message with no id (a string) is rejected whichever way: Celery's ``Request`` raised ``KeyError`` for it on the
consumer's thread, and the message was never dead-lettered.

Everything else takes Celery's own way, per message: a message with an ETA (a retry's countdown) or an expiry, a
revoked id, a rate-limited task, task events switched on (Flower watching, ``AGENTFLEET_TASK_EVENTS``: their
``task-received`` / ``task-started`` / ``task-succeeded`` come from Celery's ``Request``), a receiver connected to
one of Celery's task signals (an instrumentation's ``task_prerun``), a pool that takes work under a semaphore
(prefork), a body that is not Celery's protocol 2 in JSON.

Why: Celery's ``Request`` and tracer were about a sixth of an iteration's worker CPU. By the kernel's thread times
(``benchmarks/thread_cpu.py``) the fleet's workers spent 1.41× the CPU of Celery + one commit a hop with them, and
1.10-1.19× without (benchmarks/README.md, issue 23).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import Celery, Task, signals
from celery._state import _task_stack
from celery.exceptions import Ignore, Reject, Retry
from celery.worker import state as worker_state
from celery.worker.strategy import default as celery_strategy

log = logging.getLogger(__name__)

JSON = "application/json"
# Signals Celery's ``Request`` and tracer send around a task. With a receiver connected to any (an instrumentation,
# say), messages take Celery's way, which sends them.
TASK_SIGNALS = (signals.task_received, signals.task_prerun, signals.task_postrun, signals.task_success,
                signals.task_failure, signals.task_retry, signals.task_internal_error)


class _Handling:
    """One message taken the short way: what ``inspect active`` shows of it (``Request.info``'s fields), and the
    run of its task on a pool thread."""

    __slots__ = ("__weakref__", "_args", "_kwargs", "ack", "acknowledged", "errors", "eventer", "hostname", "id",
                 "message", "name", "reject", "task", "time_start", "worker_pid")

    def __init__(self, task: Task, message: Any, hostname: str, ack: Any, reject: Any, errors: tuple[Any, ...]
                 ) -> None:
        headers = message.headers
        self.id: str = headers["id"]
        self.name: str = headers["task"]
        self.hostname = hostname
        self.message = message
        self.ack, self.reject, self.errors = ack, reject, errors
        self.task = task
        self.time_start: float | None = None
        self.worker_pid: int | None = None
        self.acknowledged = False
        self.eventer: Any = None  # set by Celery's event bootstep on what it holds when it reconnects; sends nothing
        self._args: Any = headers.get("argsrepr", "")
        self._kwargs: Any = headers.get("kwargsrepr", "")

    @property
    def delivery_info(self) -> dict[str, Any]:
        info, properties = self.message.delivery_info or {}, self.message.properties or {}
        return {"exchange": info.get("exchange"), "routing_key": info.get("routing_key"),
                "priority": properties.get("priority"), "redelivered": info.get("redelivered", False)}

    def info(self, safe: bool = False) -> dict[str, Any]:  # ``inspect active``; the reprs only: payloads stay out
        return {"id": self.id, "name": self.name, "args": self._args, "kwargs": self._kwargs, "type": self.name,
                "hostname": self.hostname, "time_start": self.time_start, "acknowledged": self.acknowledged,
                "delivery_info": self.delivery_info, "worker_pid": self.worker_pid}

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """``revoke --terminate``: what a ``Request`` does on this pool, which stops no thread (it raises)."""
        pool.terminate_job(self.worker_pid, signal)

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> None:
        """Asked of every unacked handling when the broker connection is lost: a thread cannot be stopped. Its ack
        cannot reach the broker any more (the delivery tag was the lost channel's), so the broker sends the message
        again, as for a ``Request`` on this pool."""
        pool.terminate_job(self.worker_pid, signal)

    def run(self) -> None:
        """On a pool thread: the task with the context Celery's tracer would give it, then the ack or reject its
        outcome asks for (module docstring)."""
        self.time_start, self.worker_pid = time.time(), os.getpid()
        worker_state.task_accepted(self)
        task, succeeded = self.task, False
        try:
            try:
                args, kwargs, request = self._decoded()
            except Exception as exc:  # Celery's consumer rejects what it cannot decode (FleetConsumer): kept, not run
                log.error("undecodable task message rejected: %s", exc, extra={"task": self.name, "id": self.id})
                self._settle(ack=False)
                return
            task.push_request(request)
            _task_stack.push(task)
            try:
                task.run(*args, **kwargs)
                succeeded = True
            except (Retry, Ignore):  # a retry's copy is already published (and confirmed): this one is done
                self._settle(ack=True)
                return
            except Reject as exc:
                self._settle(ack=False, requeue=bool(exc.requeue))
                return
            except Exception:  # past run_event's own answers (a bug, arguments no handler takes): kept, with why
                log.exception("task raised; its message is rejected", extra={"task": self.name, "id": self.id})
                self._settle(ack=False)
                return
            finally:
                _task_stack.pop()
                task.pop_request()
            self._settle(ack=True)
        except BaseException:  # SystemExit, KeyboardInterrupt: the handling did not end, so its message goes back
            self._settle(ack=False, requeue=True)
            raise
        finally:
            worker_state.task_ready(self, successful=succeeded)

    def _decoded(self) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        """The task's arguments and its request, as ``Request`` and the tracer build it: the message's headers, the
        canvas options of its body, its properties, delivery info and the worker's hostname."""
        message = self.message
        args, kwargs, embed = message.decode()  # kombu's, with the consumer's accepted content types
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(embed, dict | None):
            raise ValueError("a task message's body is [args, kwargs, options]")
        properties = message.properties or {}
        return args, kwargs, {
            **message.headers, **(embed or {}), "properties": properties, "reply_to": properties.get("reply_to"),
            "correlation_id": properties.get("correlation_id"), "hostname": self.hostname,
            "delivery_info": self.delivery_info, "args": args, "kwargs": kwargs, "is_eager": False,
            "called_directly": False}

    def _settle(self, *, ack: bool, requeue: bool = False) -> None:
        if not self.acknowledged:
            self.acknowledged = True
            if ack:
                self.ack(log, self.errors)
            else:
                self.reject(log, self.errors, requeue)


def _ran(_: object) -> None:
    """Nothing to do once a handling has run: it settled its message itself."""


def _listened() -> bool:
    return any(signal.receivers for signal in TASK_SIGNALS)


def task_events(consumer: Any, task: Task) -> bool:
    """Whether the worker sends ``task.*`` events now. Its dispatcher is on for heartbeats whatever the setting; the
    task group is in its groups when ``worker_send_task_events`` is set or once Flower (``enable_events``) asked."""
    dispatcher = consumer.event_dispatcher
    return bool(dispatcher is not None and dispatcher.enabled and task.send_events
                and (not dispatcher.groups or "task" in dispatcher.groups))


def fleet_strategy(task: Task, app: Celery, consumer: Any, **kwargs: Any) -> Any:
    """The handler Celery calls for each of ``task``'s messages (``Task.Strategy``): the short way where it holds,
    Celery's default strategy for the rest (module docstring)."""
    default = celery_strategy(task, app, consumer, **kwargs)
    pool = consumer.pool
    hostname = consumer.hostname
    revoked = consumer.controller.state.revoked
    buckets = consumer.task_buckets
    # Celery's own way where the pool takes work under a semaphore (prefork's putlocks): the short way never acquires.
    plain = consumer.on_task_request == getattr(consumer.controller, "_process_task", None)
    errors = consumer.connection_errors

    def handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any) -> Any:
        headers = message.headers
        if not isinstance(headers.get("id"), str):  # either way would raise on the consumer's thread, every redelivery
            log.error("task message without an id rejected", extra={"task": task.name})
            reject(log, errors, False)
            return None
        if (body is not None or message.content_type != JSON or headers.get("eta") or headers.get("expires")
                or headers.get("id") in revoked or task_events(consumer, task) or _listened()
                or buckets.get(task.name) is not None or not plain):
            return default(message, body, ack, reject, callbacks)
        handling = _Handling(task, message, hostname, ack, reject, errors)
        worker_state.task_reserved(handling)
        if callbacks:
            for callback in callbacks:
                callback(handling)
        pool.apply_async(handling.run, callback=_ran)  # a pool calls it with what ``run`` returned
        return None

    return handle
