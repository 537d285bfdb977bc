"""The whole fleet in one process: three real Celery workers (one per role) as threads.

Embedded mode runs them over kombu's in-memory transport (which only connects
threads of one process) and SQLite. This is not Celery's eager mode: messages are
routed through the topic exchange as in the distributed fleet. With distributed
settings the same class runs the roles as threads against RabbitMQ and Postgres.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

from celery.worker import WorkController
from celery.worker import state as worker_state

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.errors import AgentfleetError
from agentfleet.events.contracts import Goal
from agentfleet.models.base import Model
from agentfleet.roles.admission import admit, check_conflict, goal_event
from agentfleet.roles.runtime import PREFLIGHT_DONE_KEY, Runtime, close_runtime, runtime_for, share_runtime
from agentfleet.store import db
from agentfleet.store.repository import Store
from agentfleet.workers.app import add_tool_queues, create_app
from agentfleet.workers.pool import ResizableThreadPool
from agentfleet.workers.roles import ROLES

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0
STOP_CHECK_S = 0.1


class _ReadyWorker(WorkController):
    """A WorkController that says when its consumer is up."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def should_use_eventloop(self) -> bool:
        # kombu's event-loop hub is one per process; several workers in one process would share
        # it across threads. The synchronous consumer loop keeps each worker to its own thread.
        return False

    def on_consumer_ready(self, consumer: Any) -> None:
        super().on_consumer_ready(consumer)
        _wake_often(consumer.connection)
        self.ready.set()


def _wake_often(connection: Any) -> None:
    """Celery's synchronous loop waits up to 2 s for a message before it looks at ``should_stop``: three
    workers stopping in turn took 3-4 s, paid by every ``agentfleet run``. Waiting at most
    ``STOP_CHECK_S`` per cycle lets each see the stop at once; a message still arrives as soon as it is there."""
    drain = connection.drain_events

    def drain_briefly(timeout: float | None = None, **kwargs: Any) -> Any:
        return drain(timeout=STOP_CHECK_S if timeout is None else min(timeout, STOP_CHECK_S), **kwargs)

    connection.drain_events = drain_briefly


class InProcessFleet:
    def __init__(self, settings: Settings, *, executor_concurrency: int = 4) -> None:
        self.settings = settings
        self.executor_concurrency = executor_concurrency
        self.app = create_app(self.settings)
        self._workers: list[tuple[_ReadyWorker, threading.Thread]] = []

    @property
    def runtime(self) -> Runtime:
        return runtime_for(self.app)

    @property
    def store(self) -> Store:
        return self.runtime.store

    def start(self) -> InProcessFleet:
        db.upgrade(self.settings.effective_database_url)
        self.app.finalize()
        # The solo and thread pools look tasks up on the current app, which falls back to the
        # default app in pool threads; all role apps register the same tasks over one runtime.
        self.app.set_default()
        with self.app.connection_for_write() as conn:
            self.runtime.topology.declare(conn)
        for role in ROLES.values():
            # One app per role: a worker's queue selection lives on its app, so workers sharing
            # one app would all consume the last role's queue. They share the runtime (one store).
            role_app = create_app(self.settings)
            role_app.conf[PREFLIGHT_DONE_KEY] = True  # the database was just migrated; the agents are loaded
            share_runtime(role_app, self.runtime)
            worker = _ReadyWorker(
                app=role_app,
                hostname=f"{role.name}@embedded",
                queues=[role.queue(self.settings.namespace), *(add_tool_queues(
                    role_app, self.settings.namespace, self.runtime.topology.tool_queues)
                    if role.name == C.EXECUTOR else [])],  # one machine: its executor takes every tool's calls
                pool_cls=ResizableThreadPool if role.name == C.EXECUTOR else "solo",
                concurrency=self.executor_concurrency if role.name == C.EXECUTOR else 1,
                loglevel=self.settings.log_level,
                without_heartbeat=True,
                without_mingle=True,
                without_gossip=True,
            )
            thread = threading.Thread(target=worker.start, name=f"agentfleet-{role.name}", daemon=True)
            thread.start()
            self._workers.append((worker, thread))
        for worker, _ in self._workers:
            if not worker.ready.wait(START_TIMEOUT_S):
                self.stop()
                raise AgentfleetError(f"embedded worker {worker.hostname} did not start in {START_TIMEOUT_S}s")
        return self

    def use_model(self, agent: str, model: Model) -> None:
        """Run ``agent`` on ``model`` in this fleet (the declared agent is left as it is)."""
        self.runtime.agents = self.runtime.agents.replaced(agent, model)

    def submit(self, body: dict[str, Any] | Goal) -> str:
        """Admit a goal (raising GoalRejected) and publish it; returns the run id."""
        goal = admit(self.runtime.agents, body.model_dump() if isinstance(body, Goal) else body)
        event = goal_event(goal)
        check_conflict(goal.goal_id, goal.input, self.store.get_run(event.run_id))
        self.runtime.publisher.publish([event])
        return event.run_id

    def stop(self) -> None:
        """Warm shutdown, performed by each worker in its own thread.

        Calling ``WorkController.stop`` from here would cancel consumers on a connection the
        worker thread is reading (py-amqp connections are not thread-safe) and can deadlock.
        Celery's loops check ``should_stop`` between messages and shut down from inside.
        """
        if not self._workers:
            return
        worker_state.should_stop = 0
        try:
            for _, thread in self._workers:
                thread.join(timeout=15)
        finally:
            worker_state.should_stop = None
        stuck = [w.hostname for w, t in self._workers if t.is_alive()]
        self._workers.clear()
        if stuck:
            log.warning("workers did not stop in time", extra={"workers": stuck})
        close_runtime(self.app)

    def __enter__(self) -> InProcessFleet:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class EmbeddedFleet(InProcessFleet):
    """The default way to run on one machine: memory broker, SQLite, no services."""

    def __init__(self, settings: Settings, *, executor_concurrency: int = 4) -> None:
        super().__init__(settings.with_profile("embedded"), executor_concurrency=executor_concurrency)
