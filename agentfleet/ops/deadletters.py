"""Dead letters you can work with: list, show, replay to where they came from, purge.

The dead-letter queue stays the one place they are kept. It is read with basic.get and
no ack; closing the channel hands back every message not acked, in its place in the queue,
so listing changes nothing. Replaying publishes a copy (confirmed by the broker) before it
acks the dead one: a crash in between leaves a duplicate, never a loss.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from agentfleet import constants as C
from agentfleet.errors import AgentfleetError, MalformedEvent
from agentfleet.events.envelope import decode
from agentfleet.events.publisher import Publisher, client_headers
from agentfleet.events.topology import Topology

DEFAULT_LIMIT = 10_000
_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "message_id", "user_id", "app_id")


@dataclass(frozen=True)
class DeadLetter:
    id: str
    reason: str
    error_code: str | None
    source: str
    original_exchange: str
    original_routing_key: str
    dead_at: datetime | None
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: bytes = field(repr=False)

    @classmethod
    def from_raw(cls, message: Any) -> DeadLetter:
        """From a py-amqp message as received: its body not decoded, not decompressed."""
        raw_props = dict(message.properties or {})
        headers = dict(raw_props.get("application_headers") or {})
        props = {k: v for k in _PROPERTIES if (v := raw_props.get(k)) is not None}
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        death = (headers.get("x-death") or [{}])[0] if C.HEADER_DEAD_REASON not in headers else {}
        if death:  # dead-lettered by the broker (a rejected or expired message), not by us
            keys = death.get("routing-keys") or [""]
            return cls(
                id=_id(props, headers, body), reason=f"{death.get('reason', '?')} from queue {death.get('queue', '?')}",
                error_code=None, source=f"queue:{death.get('queue', '?')}", original_exchange=death.get("exchange", ""),
                original_routing_key=str(keys[0]), dead_at=_time(death.get("time")), headers=headers,
                properties=props, body=body)
        return cls(
            id=_id(props, headers, body), reason=str(headers.get(C.HEADER_DEAD_REASON, "")),
            error_code=headers.get(C.HEADER_DEAD_ERROR_CODE), source=str(headers.get(C.HEADER_DEAD_SOURCE, "")),
            original_exchange=str(headers.get(C.HEADER_DEAD_EXCHANGE, "")),
            original_routing_key=str(headers.get(C.HEADER_DEAD_ROUTING_KEY, "")),
            dead_at=_time(headers.get(C.HEADER_DEAD_AT)), headers=headers, properties=props, body=body)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "dead_at": self.dead_at.isoformat() if self.dead_at else None,
                "error_code": self.error_code, "reason": self.reason, "source": self.source,
                "original_exchange": self.original_exchange, "original_routing_key": self.original_routing_key,
                "bytes": len(self.body)}

    def detail(self, head: int = 2000) -> dict[str, Any]:
        compressed = "compression" in self.headers
        text = None if compressed else self.body[:head].decode("utf-8", errors="replace")
        return {**self.summary(), "properties": self.properties, "headers": _plain(self.headers),
                "body_head": text, "body_compressed_with": self.headers.get("compression")}


@dataclass(frozen=True)
class Filter:
    """Which dead letters a command is about; every given condition must hold."""

    ids: tuple[str, ...] = ()
    reason: str | None = None  # a substring of the reason or the error code, any case
    since: datetime | None = None
    source: str | None = None
    before: datetime | None = None  # died before it (retention); a letter without a time of death is kept

    def __call__(self, letter: DeadLetter) -> bool:
        if self.ids and letter.id not in self.ids:
            return False
        if self.reason and self.reason.lower() not in f"{letter.reason} {letter.error_code or ''}".lower():
            return False
        if self.since and (letter.dead_at is None or letter.dead_at < self.since):
            return False
        if self.before and (letter.dead_at is None or letter.dead_at >= self.before):
            return False
        return not (self.source and not letter.source.startswith(self.source))



class DeadLetterQueue:
    def __init__(self, app: Celery, topology: Topology, publisher: Publisher) -> None:
        self.app = app
        self.topology = topology
        self.publisher = publisher

    @contextmanager
    def _browse(self, limit: int) -> Iterator[list[tuple[DeadLetter, Callable[[], None]]]]:
        """Up to ``limit`` dead letters, each with its ack. Read raw from the channel: kombu would decompress
        (and refuse) a body on the way in, and a dead letter is often one that could not be decoded."""
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
            channel = conn.channel()
            try:
                self.topology.dead_queue(channel).declare()
                got: list[tuple[DeadLetter, Callable[[], None]]] = []
                while len(got) < limit:
                    message = channel.basic_get(queue=self.topology.dead_queue.name, no_ack=False)
                    if message is None:
                        break
                    tag = message.delivery_info["delivery_tag"]
                    got.append((DeadLetter.from_raw(message), lambda tag=tag: channel.basic_ack(tag)))
                yield got
            finally:
                channel.close()  # every message not acked goes back where it was

    def list(self, match: Filter, limit: int = DEFAULT_LIMIT) -> list[DeadLetter]:
        with self._browse(limit) as letters:
            return [letter for letter, _ in letters if match(letter)]

    def replay(self, match: Filter, *, routing_key: str | None = None, limit: int = DEFAULT_LIMIT
               ) -> list[tuple[DeadLetter, str]]:
        """Send each matching letter back where it came from; (letter, what was done) for each."""
        return self._each(match, limit, lambda letter: self._send_back(letter, routing_key))

    def purge(self, match: Filter, limit: int = DEFAULT_LIMIT) -> list[tuple[DeadLetter, str]]:
        return self._each(match, limit, lambda _letter: "purged")

    def _each(self, match: Filter, limit: int, act: Callable[[DeadLetter], str]) -> list[tuple[DeadLetter, str]]:
        done = []
        with self._browse(limit) as letters:
            for letter, ack in letters:
                if not match(letter):
                    continue
                try:
                    outcome = act(letter)
                except AgentfleetError as exc:
                    done.append((letter, f"kept: {exc}"))
                    continue
                ack()
                done.append((letter, outcome))
        return done

    def _send_back(self, letter: DeadLetter, routing_key: str | None) -> str:
        key = routing_key or letter.original_routing_key
        if letter.source.startswith("task:"):  # an internal event we kept as its envelope
            try:
                env = decode(json.loads(letter.body))
            except (ValueError, MalformedEvent) as exc:
                raise AgentfleetError(f"not an event envelope, cannot be sent as a task: {exc}") from None
            self.publisher.publish([env])
            return f"replayed as task {env.type}"
        if not letter.original_exchange and not key:
            raise AgentfleetError("it does not say where it came from")
        props = {k: v for k, v in letter.properties.items() if k != "message_id"}
        self.publisher.publish_json(letter.original_exchange, key, letter.body, headers=client_headers(letter.headers)
                                    | _kept_structured(letter.headers), properties=props)
        return f"replayed to {letter.original_exchange or '(default)'} with routing key {key}"


def _kept_structured(headers: dict[str, Any]) -> dict[str, Any]:
    """Celery's own structured headers (argsrepr, kwargsrepr, ...) travel back with a task message."""
    return {k: v for k, v in headers.items()
            if not k.startswith(C.HEADER_PREFIX) and not k.startswith(C.BROKER_DEATH_HEADERS)
            and isinstance(v, list | dict | type(None))}


def _id(props: dict[str, Any], headers: dict[str, Any], body: bytes) -> str:
    known = props.get("message_id") or headers.get("id")  # ours, or a Celery task's id
    if isinstance(known, str) and known:
        return known.replace("-", "")[:16]
    return hashlib.sha256(body + repr(sorted(map(str, headers.items()))).encode()).hexdigest()[:16]


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            return _time(datetime.fromisoformat(value))
        except ValueError:
            return None
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value
