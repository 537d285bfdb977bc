"""A client of the distributed fleet: publishes goals to the inbox and waits for Results."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

from kombu import Consumer, Message, Queue

from agentfleet.config.settings import Settings
from agentfleet.constants import DOMAIN_ROUTING_PREFIX
from agentfleet.events.contracts import Result
from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.loop.keys import run_id_for
from agentfleet.roles.runtime import runtime_for
from agentfleet.workers.app import create_app
from agentfleet.workers.preflight import reach_all


class FleetClient:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self.rt = runtime_for(self.app)
        self.connection = self.app.connection_for_write()

    def __enter__(self) -> FleetClient:
        reach_all(self.settings, "broker", "database")  # bounded; exit 69 naming the setting
        self.connection.ensure_connection(max_retries=3)
        self.rt.topology.declare(self.connection)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.connection.release()

    @staticmethod
    def run_id(body: dict[str, Any]) -> str:
        return run_id_for(body["agent"], body["goal_id"])

    def publish_goal(self, body: dict[str, Any], *, reply_to: str | None = None,
                     correlation_id: str | None = None) -> None:
        self.rt.publisher.publish_json(self.rt.topology.inbox, f"goal.{body['agent']}", body,
                                       reply_to=reply_to, correlation_id=correlation_id,
                                       declare=[self.rt.topology.inbox_queue])

    def publish_event(self, name: str, body: bytes, *, message_id: str | None = None) -> None:
        """A domain event, as outside systems send it: its payload as plain JSON under ``domain.<name>``."""
        self.rt.publisher.publish_json(self.rt.topology.inbox, f"{DOMAIN_ROUTING_PREFIX}{name}", body,
                                       declare=[self.rt.topology.inbox_queue],
                                       properties={"message_id": message_id} if message_id else None)

    def submit_and_wait(self, body: dict[str, Any], *, timeout_s: float,
                        on_tick: Callable[[], None] | None = None) -> Result | None:
        """Publish the goal and wait for its Result on a private reply queue; None if the wait runs out.
        ``on_tick`` is called at least once a second meanwhile (progress lines)."""
        correlation_id = uuid.uuid4().hex
        reply_queue = Queue(f"{self.settings.namespace}.reply.{correlation_id}", exclusive=True, auto_delete=True)
        box: list[Result] = []

        def on_message(message: Message) -> None:
            if message.properties.get("correlation_id") == correlation_id:
                box.append(Result.model_validate(json.loads(message.body)))
            message.ack()

        with Consumer(self.connection, queues=[reply_queue], on_message=on_message):
            self.publish_goal(body, reply_to=reply_queue.name, correlation_id=correlation_id)
            deadline = time.monotonic() + timeout_s
            while not box and time.monotonic() < deadline:
                if on_tick is not None:
                    on_tick()
                try:
                    self.connection.drain_events(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                except TimeoutError:
                    continue
        return box[0] if box else None

    def cancel(self, run_id: str, reason: str) -> None:
        event = Envelope.new(EventType.RUN_CANCEL_REQUESTED, run_id, RunCancelRequested(reason=reason),
                             trace_id=uuid.uuid4().hex)
        self.rt.publisher.publish([event])
