"""Worker bootsteps: declare the topology on start, and consume plain-JSON goals from the inbox."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
from typing import Any

from celery import bootsteps, signals
from celery.worker import state as celery_state
from kombu import Consumer

from agentfleet import constants as C
from agentfleet.events.publisher import queue_depths
from agentfleet.events.topology import AFFINE_ROLES
from agentfleet.fleet.health_cache import CheckPlan, plan_checks
from agentfleet.hooks.metrics import PrometheusHook
from agentfleet.roles import approvals, retention, schedules
from agentfleet.roles.runtime import PREFLIGHT_DONE_KEY, Runtime, runtime_for, settings_of
from agentfleet.roles.sweeper import sweep
from agentfleet.workers.inbox import Inbox
from agentfleet.workers.preflight import preflight

log = logging.getLogger(__name__)


class Preflight(bootsteps.StartStopStep):
    """The checks of workers/preflight.py, for a worker started as ``celery -A agentfleet.workers.app worker``.

    ``agentfleet worker`` makes them before Celery starts (for its exit codes) and marks
    the app, so they are not made twice. A failed check is Celery's "unrecoverable
    error": logged, and the worker exits 1 before it consumes anything.
    """

    def start(self, worker: Any) -> None:
        if not worker.app.conf.get(PREFLIGHT_DONE_KEY):
            preflight(settings_of(worker.app), stop_check=celery_state.maybe_shutdown)


class DeclareTopology(bootsteps.StartStopStep):
    """Every process declares every exchange and queue, so nothing published is ever unroutable.

    A worker-blueprint step: it finishes before the consumer (and its remote-control
    queue) starts, so a worker that answers a ping has already declared the inbox.
    """

    requires = (Preflight,)

    def start(self, worker: Any) -> None:
        rt = runtime_for(worker.app)
        with worker.app.connection_for_write() as conn:
            # Bounded, and a SIGTERM meanwhile stops the worker (Celery's handler only sets a flag).
            conn.ensure_connection(max_retries=None, timeout=rt.settings.connect_timeout_s,
                                   callback=celery_state.maybe_shutdown)
            rt.topology.declare(conn)
            if rt.topology.affinity:
                for role in AFFINE_ROLES:
                    if rt.topology.role_queues[role].name in worker.app.amqp.queues.consume_from:
                        self._own_queue(worker, rt, conn, role)
        log.info("topology declared", extra={"namespace": rt.topology.namespace})

    @staticmethod
    def _own_queue(worker: Any, rt: Runtime, conn: Any, role: str) -> None:
        """A planner or observer consumes a queue of its own beside the role queue: the next events of the runs it
        moved come back to it (``Topology`` affinity). A new token each start: what the last one left moves to the
        role queue."""
        token = rt.topology.own_token(role, worker.hostname)
        if token is None:
            log.warning("no affinity: the namespace leaves no room for a queue of this process's own",
                        extra={"role": role, "namespace": rt.topology.namespace})
            return
        own = rt.topology.own_queue(role, token)
        own.bind(conn.default_channel).declare()
        worker.app.amqp.queues.select_add(own)
        rt.tokens[role] = token
        log.info("own queue declared", extra={"queue": own.name})


class MetricsServer(bootsteps.StartStopStep):
    """Serves the metrics hook's registry on AGENTFLEET_METRICS_ADDR:PORT (one endpoint per process)."""

    requires = (DeclareTopology,)

    def start(self, worker: Any) -> None:
        rt = runtime_for(worker.app)
        hook = rt.hooks.find(PrometheusHook)
        if hook is None or rt.settings.metrics_port is None:
            return
        hook.read_queue_depths(lambda: queue_depths(rt.publisher.app, rt.topology))
        hook.serve(rt.settings.metrics_port, rt.settings.metrics_addr)


class _Timer(bootsteps.StartStopStep):
    """A thread doing ``tick`` every ``interval`` in workers of ``role``; a failed tick is logged, not fatal."""

    requires = (DeclareTopology,)
    role = ""
    name_of_thread = ""
    tick_at_start = False  # tick once before the worker consumes anything

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        super().__init__(parent, **kwargs)

    def interval(self, rt: Runtime) -> float:
        raise NotImplementedError

    def tick(self, rt: Runtime) -> None:
        raise NotImplementedError

    def start(self, worker: Any) -> None:
        rt = runtime_for(worker.app)
        queue = C.queue_name(rt.topology.namespace, self.role)
        if self.interval(rt) <= 0 or queue not in worker.app.amqp.queues.consume_from:
            return
        if self.tick_at_start:
            try:
                self.tick(rt)
            except Exception:
                log.exception("%s failed", self.name_of_thread)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(rt,), name=self.name_of_thread, daemon=True)
        self._thread.start()

    def stop(self, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self, rt: Runtime) -> None:
        while not self._stop.wait(self.interval(rt)):
            try:
                self.tick(rt)
            except Exception:  # the database, broker or Redis is away: the next tick tries again
                log.exception("%s failed", self.name_of_thread)


class SweepTimer(_Timer):
    """Observer workers look for stalled runs every ``sweep_interval_s``; one sweep acts at a time fleet-wide."""

    role = C.OBSERVER
    name_of_thread = "agentfleet-sweeper"

    def interval(self, rt: Runtime) -> float:
        return rt.settings.sweep_interval_s

    def tick(self, rt: Runtime) -> None:
        for f in sweep(rt) or []:
            log.info("sweeper: %s %s", f.action, f.reason, extra={"run_id": f.run_id, "quiet_s": f.quiet_s})


class RetentionTimer(_Timer):
    """Observer workers delete ended runs past their keeping time (``roles.retention``) every
    ``retention_interval_s``, when a keeping time is set; one pass at a time fleet-wide."""

    role = C.OBSERVER
    name_of_thread = "agentfleet-retention"

    def interval(self, rt: Runtime) -> float:
        return rt.settings.retention_interval_s

    def tick(self, rt: Runtime) -> None:
        report = retention.apply_policy(rt.store, rt.settings.retention_days, rt.agents.all())
        if report is not None and (report.runs or any(report.rows.values())):
            log.info("retention: deleted %d ended run(s) in %.1f s", report.runs, report.seconds,
                     extra={"rows": report.rows, "bytes_before": report.bytes_before,
                            "bytes_after": report.bytes_after})


class ScheduleTimer(_Timer):
    """Observer workers fire due schedules' goals every ``schedule_poll_s``; each tick once fleet-wide however
    many observers look (``roles.schedules``)."""

    role = C.OBSERVER
    name_of_thread = "agentfleet-scheduler"

    def interval(self, rt: Runtime) -> float:
        return rt.settings.schedule_poll_s

    def tick(self, rt: Runtime) -> None:
        for fired in schedules.fire_due(rt):
            if fired["goal_ids"]:
                log.info("schedule %s fired %s", fired["schedule_id"], ", ".join(fired["goal_ids"]))


class ApprovalTimer(_Timer):
    """Observer workers expire unanswered approval requests, and send answers nobody acted on yet (their
    event was lost, or the CLI recorded them beside an embedded fleet). One pass at a time fleet-wide."""

    role = C.OBSERVER
    name_of_thread = "agentfleet-approvals"

    def interval(self, rt: Runtime) -> float:
        return rt.settings.approval_poll_s

    def tick(self, rt: Runtime) -> None:
        approvals.tick(rt)


class HealthTimer(_Timer):
    """Executor workers (which host the tool code) re-check tools whose cached health has expired.

    Every executor looks each tick; the one that claims an expired check runs it, the rest
    leave it, so the fleet runs each check about once per TTL however many executors it has.
    """

    role = C.EXECUTOR
    name_of_thread = "agentfleet-health"
    # An executor looks at its tools' health once before it takes calls (bounded by the checks'
    # timeouts), so the first calls after a start are gated on what is known, not on "unknown".
    tick_at_start = True

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self._plans: dict[str, CheckPlan] | None = None
        super().__init__(parent, **kwargs)

    def interval(self, rt: Runtime) -> float:
        return rt.settings.health_tick_s

    def tick(self, rt: Runtime) -> None:
        if self._plans is None:
            self._plans = plan_checks(t for agent in rt.agents.all() for t in agent.tools.values())
        rt.dispatch.health.check_due(self._plans)


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


class WakeOnShutdown(bootsteps.StartStopStep):
    """A shutdown signal wakes the consumer's event loop at once.

    Celery's handler for SIGTERM, SIGINT and SIGQUIT only sets a flag, which its loop reads between polls, and the
    poll is retried after the signal (PEP 475) until a timer or a message ends it: an idle worker sat 1.4-1.7 s
    (up to kombu's 10 s cap) on every stop, by ``agentfleet scale``, a deploy, or a test's fleet. A pipe in the
    poll, written from Celery's ``worker_shutting_down`` signal (sent by that handler in the main process), ends
    the wait; what the stop then does (warm or cold) is Celery's, unchanged. Registered again whenever the loop is
    built, since a lost connection resets the hub and drops its readers.
    """

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._pipe: tuple[int, int] | None = None

    @property
    def fd(self) -> int | None:
        """The end the loop polls, while the step is live."""
        return self._pipe[0] if self._pipe else None

    def register_with_event_loop(self, c: Any, hub: Any) -> None:
        if self._pipe is None:
            self._pipe = os.pipe()
            for end in self._pipe:
                os.set_blocking(end, False)
            signals.worker_shutting_down.connect(self._wake, weak=False)
        hub.add_reader(self._pipe[0], self._drain)

    def shutdown(self, c: Any) -> None:
        if self._pipe is None:
            return
        signals.worker_shutting_down.disconnect(self._wake)
        for end in self._pipe:
            os.close(end)
        self._pipe = None

    def _wake(self, **_: Any) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed
                os.write(self._pipe[1], b"\0")

    def _drain(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.read(self._pipe[0], 512)


class FreezeStartupHeap(bootsteps.StartStopStep):
    """Once the consumer is about to consume: what start-up made (every module, class and setting) is collected
    once and then moved out of the cyclic garbage collector's reach (``gc.freeze``).

    Those objects live as long as the process; without this, every full collection walks them again, and the last
    one, when the interpreter finalizes, took 0.5-0.7 s of a stopping worker's CPU (a py-spy dump of a worker
    stopping showed only ``gc_collect_main``): a fleet's stop went from 0.6-0.7 s to 0.1 s. Objects freed later
    are still freed by reference counting; only cycles among start-up objects would be kept, and ``gc.collect``
    first clears those there are. Once a process: a reconnect restarts the consumer's steps.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)
    _done = False

    def start(self, c: Any) -> None:
        if FreezeStartupHeap._done:
            return
        gc.collect()
        gc.freeze()
        FreezeStartupHeap._done = True
