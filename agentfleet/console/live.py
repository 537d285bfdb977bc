"""What pages hear as it happens: the fleet's ``<ns>.public`` exchange, read by one consumer per console process
and handed to each open page's event stream; and the fleet's workers and queue depths, looked at every few seconds
by a thread of their own (a broadcast to the workers waits out its timeout), so the fleet page and the queue-depth
chart render from the latest look instead of waiting for one.

One thread holds one broker connection and a private auto-delete queue bound to every public notice; each
Server-Sent-Events stream subscribes with a bounded asyncio queue (a page that stops reading loses notices, not
memory: it is told to reload its view). Only what is needed to decide what to redraw crosses over: the notice's
type and its run and trace ids, never its body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection, Consumer, Message, Queue, binding

from agentfleet.ops.fleet import workers_view
from agentfleet.roles.runtime import Runtime

log = logging.getLogger(__name__)

SUBSCRIBER_BACKLOG = 100  # notices a stream may fall behind by before it is told to redraw everything
FLEET_LOOK_S = 5.0  # how often the workers and the role queues' depths are looked at
FLEET_LOOK_TIMEOUT_S = 1.0  # how long a look waits for workers to answer
DEPTH_SAMPLES = 120  # kept: ten minutes at the default rate
RECONNECT_S = 2.0


@dataclass(frozen=True)
class Heard:
    """A public notice, as much of it as decides what a page redraws."""

    type: str
    run_id: str | None = None
    trace_id: str | None = None

    @classmethod
    def of(cls, raw: Any) -> Heard | None:
        try:
            body = json.loads(raw)
        except (TypeError, ValueError):
            return None
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            return None
        run_id, trace_id = body.get("run_id"), body.get("trace_id")
        return cls(body["type"][:64], run_id if isinstance(run_id, str) else None,
                   trace_id if isinstance(trace_id, str) else None)


@dataclass(eq=False)  # one per stream, told apart by identity
class Subscription:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Heard | None] = field(default_factory=lambda: asyncio.Queue(SUBSCRIBER_BACKLOG))

    def offer(self, heard: Heard | None) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # behind: it redraws on its next notice anyway
            self.queue.put_nowait(heard)


class _Background:
    """A daemon thread running ``_run`` from ``start`` until ``stop`` (which ``_run`` watches in ``_stop``)."""

    thread_name = "console"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        raise NotImplementedError


class PublicFeed(_Background):
    """The console's one reader of ``<ns>.public``."""

    thread_name = "console-feed"

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self.rt = rt
        self._subscribers: set[Subscription] = set()
        self._lock = threading.Lock()
        self.connected = threading.Event()

    def subscribe(self) -> Subscription:
        sub = Subscription(asyncio.get_running_loop())
        with self._lock:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(sub)

    def _hand_out(self, heard: Heard) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for sub in subscribers:
            with contextlib.suppress(RuntimeError):  # its loop has closed: the stream is gone
                sub.loop.call_soon_threadsafe(sub.offer, heard)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with Connection(self.rt.settings.broker_url, heartbeat=0) as conn:
                    conn.ensure_connection(max_retries=1)
                    self.rt.topology.declare(conn)  # a console started before any worker still finds its queues
                    queue = Queue(f"{self.rt.settings.namespace}.console.{uuid.uuid4().hex[:12]}", exclusive=True,
                                  auto_delete=True, bindings=[binding(self.rt.topology.public, routing_key="#")])

                    def on_message(message: Message) -> None:
                        message.ack()
                        heard = Heard.of(message.body)
                        if heard is not None:
                            self._hand_out(heard)

                    with Consumer(conn, queues=[queue], on_message=on_message, no_ack=False):
                        self.connected.set()
                        while not self._stop.is_set():
                            with contextlib.suppress(TimeoutError):
                                conn.drain_events(timeout=0.5)
            except Exception as exc:  # the broker went away: pages fall back to their checkpoint polls
                self.connected.clear()
                log.warning("console lost the public exchange: %s; reconnecting", exc)
                self._stop.wait(RECONNECT_S)


class FleetWatch(_Background):
    """The latest look at the fleet's workers (``ops.fleet.workers_view``) and the queue depths seen so far."""

    thread_name = "console-fleet"

    def __init__(self, rt: Runtime, *, every_s: float = FLEET_LOOK_S) -> None:
        super().__init__()
        self.rt, self.every_s = rt, every_s
        self.depths: deque[tuple[float, dict[str, int]]] = deque(maxlen=DEPTH_SAMPLES)
        self.latest: tuple[float, dict[str, Any]] | None = None
        self.problem: str | None = None

    def look(self) -> tuple[float, dict[str, Any]] | None:
        """The latest look, or one taken now when there is none yet."""
        if self.latest is None:
            self._look()
        return self.latest

    def _run(self) -> None:
        while not self._stop.is_set():
            self._look()
            self._stop.wait(self.every_s)

    def _look(self) -> None:
        try:
            view = workers_view(self.rt, timeout_s=FLEET_LOOK_TIMEOUT_S,
                                declared_tool_queues=self.rt.agents.tool_queues())
        except Exception as exc:  # the broker is away: the page says so, with the last look it had
            self.problem = f"workers unreachable: {exc}"
            return
        self.problem = None
        at = time.time()
        self.latest = (at, view)
        if view["queue_depths"]:
            self.depths.append((at, view["queue_depths"]))
