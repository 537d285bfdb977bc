"""Worker bootsteps: declare the topology on start, and consume plain-JSON goals from the inbox."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps
from kombu import Consumer

from agentfleet import constants as C
from agentfleet.tasks.runtime import runtime_for
from agentfleet.tasks.sweeper import sweep
from agentfleet.workers.inbox import Inbox

log = logging.getLogger(__name__)


class DeclareTopology(bootsteps.StartStopStep):
    """Every process declares every exchange and queue, so nothing published is ever unroutable.

    A worker-blueprint step: it finishes before the consumer (and its remote-control
    queue) starts, so a worker that answers a ping has already declared the inbox.
    """

    def start(self, worker: Any) -> None:
        rt = runtime_for(worker.app)
        with worker.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=None)
            rt.topology.declare(conn)
        log.info("topology declared", extra={"namespace": rt.topology.namespace})


class SweepTimer(bootsteps.StartStopStep):
    """Observer workers look for stalled runs every ``sweep_interval_s``; one sweep acts at a time fleet-wide."""

    requires = (DeclareTopology,)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        super().__init__(parent, **kwargs)

    def start(self, worker: Any) -> None:
        rt = runtime_for(worker.app)
        observer_queue = C.queue_name(rt.topology.namespace, C.OBSERVER)
        if rt.settings.sweep_interval_s <= 0 or observer_queue not in worker.app.amqp.queues.consume_from:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(rt,), name="agentfleet-sweeper", daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self, rt: Any) -> None:
        while not self._stop.wait(rt.settings.sweep_interval_s):
            try:
                findings = sweep(rt)
            except Exception:  # the database or broker is away: the next tick tries again
                log.exception("sweep failed")
                continue
            for f in findings or []:
                log.info("sweeper: %s %s", f.action, f.reason, extra={"run_id": f.run_id, "quiet_s": f.quiet_s})


class InboxConsumer(bootsteps.ConsumerStep):
    """Planner workers turn goals published by any AMQP client into goal.submitted events.

    Whatever arrives (any header, encoding, size or nesting) is admitted, or answered on
    ``reply_to`` and dead-letted with its reason; nothing a client sends can stop the consumer.
    """

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self.parent = parent
        super().__init__(parent, **kwargs)

    def get_consumers(self, channel: Any) -> list[Consumer]:
        app = self.parent.app  # type: ignore[attr-defined]
        rt = runtime_for(app)
        planner_queue = C.queue_name(rt.topology.namespace, C.PLANNER)
        if planner_queue not in app.amqp.queues.consume_from:
            return []
        inbox = Inbox(rt)
        return [
            Consumer(channel, queues=[rt.topology.inbox_queue], on_message=inbox.on_goal,
                     on_decode_error=inbox.on_undecodable, prefetch_count=1, no_ack=False),
            Consumer(channel, queues=[rt.topology.unroutable_queue], on_message=inbox.on_unroutable,
                     on_decode_error=lambda message, _exc: inbox.on_unroutable(message),
                     prefetch_count=1, no_ack=False),
        ]
