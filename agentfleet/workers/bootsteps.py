"""Worker bootsteps: declare the topology on start, and consume plain-JSON goals from the inbox."""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import bootsteps
from kombu import Consumer, Message

from agentfleet import constants as C
from agentfleet.errors import GoalRejected
from agentfleet.events.contracts import Result
from agentfleet.tasks.admission import admit, goal_event
from agentfleet.tasks.runtime import runtime_for

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


class InboxConsumer(bootsteps.ConsumerStep):
    """Planner workers turn goals published by any AMQP client into goal.submitted events."""

    def get_consumers(self, channel: Any) -> list[Consumer]:
        app = self.parent.app  # type: ignore[attr-defined]
        rt = runtime_for(app)
        planner_queue = C.queue_name(rt.topology.namespace, C.PLANNER)
        if planner_queue not in app.amqp.queues.consume_from:
            return []
        return [Consumer(channel, queues=[rt.topology.inbox_queue], on_message=self.on_message,
                         prefetch_count=1, no_ack=False)]

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self.parent = parent
        super().__init__(parent, **kwargs)

    def on_message(self, message: Message) -> None:
        rt = runtime_for(self.parent.app)
        props = message.properties or {}
        reply_to = props.get("reply_to")
        correlation_id = props.get("correlation_id")
        routing_key = (message.delivery_info or {}).get("routing_key")
        try:
            goal = admit(rt.agents, message.body, routing_key)
            rt.publisher.publish([goal_event(goal, reply_to=reply_to, correlation_id=correlation_id)])
        except GoalRejected as exc:
            result = Result.rejection(exc.code, exc.message, agent=_field(message.body, "agent"),
                                      goal_id=_field(message.body, "goal_id"))
            if reply_to:
                rt.publisher.reply(reply_to, correlation_id, result)
            rt.publisher.dead_letter(
                message.body if isinstance(message.body, bytes) else str(message.body).encode(),
                reason=exc.message, error_code=exc.code, source=f"inbox:{routing_key}",
                headers=message.headers, correlation_id=correlation_id,
            )
        except Exception:
            log.exception("inbox message could not be handled; dead-lettering it via the broker")
            message.reject(requeue=False)
            return
        message.ack()


def _field(body: Any, name: str) -> str | None:
    """A string field of a goal body, if the body is JSON enough to have one (for rejections)."""
    try:
        value = json.loads(body).get(name)
    except (ValueError, AttributeError, TypeError):
        return None
    return value if isinstance(value, str) else None

