"""Publishing with publisher confirms and persistent delivery.

Internal events go out as Celery task messages (so Flower shows them as the
tasks they are); goals' Results, public notifications and dead letters go out as
plain JSON for any language.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery
from kombu import Exchange

from agentfleet import constants as C
from agentfleet.events.contracts import Result
from agentfleet.events.envelope import Envelope
from agentfleet.events.topology import Topology

log = logging.getLogger(__name__)

PERSISTENT = 2
RETRY_POLICY = {"max_retries": 5, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 2.0}


class Publisher:
    def __init__(self, app: Celery, topology: Topology) -> None:
        self.app = app
        self.topology = topology

    def publish(self, envelopes: Iterable[Envelope]) -> None:
        """Send internal events; each blocks until the broker confirms it."""
        for env in envelopes:
            self.app.send_task(
                str(env.type),
                kwargs={"envelope": env.wire()},
                task_id=env.event_id,
                queue=self.topology.queue_for(env.type),
                exchange=self.topology.events.name,
                routing_key=str(env.type),
                retry=True,
                retry_policy=RETRY_POLICY,
            )

    def publish_json(
        self,
        exchange: Exchange | str,
        routing_key: str,
        body: bytes | Mapping[str, Any],
        *,
        headers: Mapping[str, Any] | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        declare: list[Any] | None = None,
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
        kwargs: dict[str, Any] = {}
        if correlation_id:
            kwargs["correlation_id"] = correlation_id
        if reply_to:
            kwargs["reply_to"] = reply_to
        with self.app.producer_or_acquire() as producer:
            producer.publish(
                data,
                exchange=exchange,
                routing_key=routing_key,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=PERSISTENT,
                headers=dict(headers or {}),
                declare=declare or [],
                retry=True,
                retry_policy=RETRY_POLICY,
                **kwargs,
            )

    def publish_public(self, event_type: str, body: Mapping[str, Any], run_id: str) -> None:
        self.publish_json(self.topology.public, event_type, {"type": event_type, "run_id": run_id, **body},
                          declare=[self.topology.public])

    def reply(self, reply_to: str, correlation_id: str | None, result: Result) -> None:
        """The Result to a client's reply queue (default exchange, routing key = queue name)."""
        self.publish_json("", reply_to, result.model_dump(mode="json"), correlation_id=correlation_id)

    def dead_letter(
        self,
        body: bytes | Mapping[str, Any],
        *,
        reason: str,
        error_code: str,
        source: str,
        headers: Mapping[str, Any] | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Keep a message we cannot handle, with why, in the dead-letter queue."""
        extra = {
            **{k: v for k, v in (headers or {}).items() if isinstance(v, str | int | float | bool)},
            C.HEADER_DEAD_REASON: reason[:1000],
            C.HEADER_DEAD_ERROR_CODE: error_code,
            C.HEADER_DEAD_SOURCE: source,
        }
        log.warning("dead-lettered", extra={"reason": reason, "error_code": error_code, "source": source})
        self.publish_json(self.topology.dead, source, body, headers=extra, correlation_id=correlation_id,
                          declare=[self.topology.dead_queue])
