"""Publishing with publisher confirms and persistent delivery.

Internal events go out as Celery task messages (so Flower shows them as the
tasks they are); goals' Results, public notifications and dead letters go out as
plain JSON for any language.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from amqp import spec
from amqp.exceptions import MessageNacked
from celery import Celery
from kombu import Exchange, Producer
from pydantic import BaseModel

from agentfleet import constants as C
from agentfleet.events.envelope import Envelope, envelope_json
from agentfleet.events.topology import Topology
from agentfleet.redaction import redact

log = logging.getLogger(__name__)

PERSISTENT = 2
CONSUMERS_VIEW_S = 2.0  # how long a planner trusts the broker's count of a dedicated tool queue's consumers
RETRY_POLICY = {"max_retries": 5, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 2.0}
# Celery's protocol-2 headers at the value its worker takes when the header is absent (``celery.worker.request.Request``
# reads each with ``.get`` and a default; the task's ``Context`` has the same defaults): not sent. py-amqp frames every
# header in Python, and these eleven of nineteen were a third of a publish's CPU (benchmarks/README.md, issue 23).
UNSAID_HEADERS: dict[str, object] = {
    "shadow": None, "eta": None, "expires": None, "group": None, "group_index": None, "retries": 0,
    "timelimit": [None, None], "parent_id": None, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {}}
_UNSET = object()
# Celery's protocol-2 body of an event: no args, the envelope the one kwarg, and no canvas to run after it.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_BODY_HEAD, _BODY_TAIL = b'[[],{"envelope":', b"}," + json.dumps(_EMBED, separators=(",", ":")).encode() + b"]"


def task_body(env: Envelope) -> bytes:
    """The event's task message body as JSON, written in one pass by pydantic's serializer from the model: the dict
    ``wire`` builds, then encoded by the json module in kombu, cost ~40 µs of a publish's CPU. Text UTF-8 cannot carry
    (a lone surrogate, which the json module escapes) takes that way still; a worker decodes either the same."""
    encoded = envelope_json(env)
    if encoded is None:
        return json.dumps([[], {"envelope": env.wire()}, _EMBED]).encode()
    return _BODY_HEAD + encoded + _BODY_TAIL


def task_reprs(env: Envelope) -> dict[str, str]:
    """What Celery's logs, Flower and `celery events` show of an event's task message: which event, never its payload
    (tool arguments and outputs, goal inputs). Given to every copy: the first, and a retry's (``Task.retry``, which
    would write its own from the arguments)."""
    return {"argsrepr": "()", "kwargsrepr": f"{{'envelope': <{env.type} run={env.run_id} event={env.event_id}>}}"}


# Producers a publisher keeps bound to connections of its own: as many threads publish at once without kombu's pool.
KEPT_PRODUCERS = 8


class KeptProducers:
    """Producers bound to connections of the publisher's own, kept from one publish to the next.

    kombu's producer pool gives a producer's connection back to its connection pool on every release, so each publish
    took a connection, made a channel promise and copied the exchange again: 58 µs of CPU of a 295 µs confirmed
    publish (benchmarks/README.md, issue 23). These keep theirs. At most ``KEPT_PRODUCERS`` are made; a publish that
    finds none free uses kombu's pool, as every publish did before, and never waits for another's. One whose use
    raised is closed, not kept: kombu's ``ensure`` has already reconnected it for the errors it retries, and for the
    rest its connection's state is not known. A forked child starts with none (the parent's sockets are not its own).
    """

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._idle: list[Producer] = []
        self._made = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def made(self) -> int:
        """Producers of its own this publisher holds now, in use or idle."""
        return self._made

    def idle(self) -> list[Producer]:
        with self._lock:
            return list(self._idle)

    @contextlib.contextmanager
    def acquire(self) -> Iterator[Producer]:
        """A kept producer, or kombu's pool's when none is free and ``KEPT_PRODUCERS`` are made."""
        producer = self._take()
        if producer is None:
            with self._app.producer_or_acquire() as pooled:
                yield pooled
            return
        try:
            yield producer
        except BaseException:
            self._discard(producer)
            raise
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append(producer)

    def close(self) -> None:
        """Close the idle producers' connections (a stopped fleet lets go of what it holds). Used again, new ones are
        made; one in use now is kept when its publish ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._made -= len(idle)
        for producer in idle:
            _close(producer)

    def _take(self) -> Producer | None:
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._made, self._pid = [], 0, os.getpid()
            if self._idle:
                return self._idle.pop()
            if self._made >= KEPT_PRODUCERS:
                return None
            self._made += 1
        try:
            return Producer(self._app.connection_for_write())  # connects on its first publish
        except BaseException:
            with self._lock:
                self._made -= 1
            raise

    def _discard(self, producer: Producer) -> None:
        with self._lock:
            self._made -= 1
        _close(producer)


def _close(producer: Producer) -> None:
    with contextlib.suppress(Exception):
        producer.connection.close()


class Publisher:
    def __init__(self, app: Celery, topology: Topology) -> None:
        self.app = app
        self.topology = topology
        # Publisher confirms are a transport option (the in-memory transport of embedded mode has none).
        self.confirms = bool((app.conf.broker_transport_options or {}).get("confirm_publish"))
        self.origin = f"{socket.gethostname()}:{os.getpid()}"  # the sender Flower shows (send_task's anon_nodename)
        self._consumers: dict[str, tuple[float, bool]] = {}  # tool queue -> (when asked, consumed)
        self.producers = KeptProducers(app)

    def close(self) -> None:
        """Let go of the connections of the producers it kept (``KeptProducers.close``)."""
        self.producers.close()

    def publish(self, envelopes: Iterable[Envelope], *, resent: bool = False) -> None:
        """Send internal events as Celery task messages on one pooled producer; every one is confirmed by the
        broker before this returns. ``resent``: copies sent again from a stored outbox, marked so (``HEADER_RESENT``).

        The message is Celery's own (protocol 2, built by ``app.amqp.as_task_v2`` as ``send_task`` builds it, so a
        worker, Flower and ``celery inspect`` see the task they always did), built once per event and published
        directly: ``send_task`` spent 270 µs of CPU a message on routing lookups, option merging and signals, and
        as much again on a ``task-sent`` event nobody reads (benchmarks/README.md). Several events (a turn's
        parallel calls) go out together and their confirms are awaited together (``_confirmed_batch``), not one
        round trip to the broker's disk each.
        """
        batch = list(envelopes)
        if not batch:
            return
        parent = self.app.current_worker_task  # as send_task links a task to the one that sent it
        root_id = (parent.request.root_id or parent.request.id) if parent else None
        messages = []
        for env in batch:
            name = str(env.type)
            task = self.app.amqp.as_task_v2(  # its headers and properties; the body is ``task_body``'s
                env.event_id, name, **task_reprs(env),
                root_id=root_id or env.event_id, parent_id=parent.request.id if parent else None,
                ignore_result=True, origin=self.origin,
            )
            exchange, routing_key, routing_headers = self.topology.route(name, env.payload)
            headers = {k: v for k, v in task.headers.items() if UNSAID_HEADERS.get(k, _UNSET) != v}
            headers.update(routing_headers)
            if resent:
                headers[C.HEADER_RESENT] = 1
            messages.append((task_body(env), dict(exchange=exchange, routing_key=routing_key,
                                                  headers=headers, content_type="application/json",
                                                  content_encoding="utf-8", delivery_mode=PERSISTENT,
                                                  **task.properties)))
        with self.producers.acquire() as producer, producer.connection._reraise_as_library_errors():
            if len(messages) == 1 or not self.confirms:
                for body, options in messages:
                    producer.publish(body, retry=True, retry_policy=RETRY_POLICY, **options)
            else:  # a lost connection sends the whole batch again: consumers dedupe on the event id
                producer.connection.ensure(producer, _confirmed_batch, **RETRY_POLICY)(producer, messages)

    def idle_tool_queues(self, names: Iterable[str]) -> set[str]:
        """Those of these dedicated tool queues no executor consumes now, asked of the broker at most once per
        ``CONSUMERS_VIEW_S`` each. A queue the broker gives no answer about counts as consumed (a call sent to it
        then waits for its run's deadline, as a call in any queue does); so does every queue of the embedded
        fleet, whose one executor consumes them all."""
        wanted = sorted(set(names))
        if not wanted or str(self.app.conf.broker_url or "").startswith("memory://"):
            return set()
        now = time.monotonic()
        stale = [q for q in wanted if now - self._consumers.get(q, (-CONSUMERS_VIEW_S, True))[0] >= CONSUMERS_VIEW_S]
        if stale:
            counted = tool_queue_status(self.app, self.topology, stale)
            for q in stale:
                self._consumers[q] = (now, counted[q][1] > 0 if q in counted else True)
        return {q for q in wanted if not self._consumers[q][1]}

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
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
        kwargs: dict[str, Any] = {"content_type": "application/json", "content_encoding": "utf-8",
                                  **(properties or {})}
        if correlation_id:
            kwargs["correlation_id"] = correlation_id
        if reply_to:
            kwargs["reply_to"] = reply_to
        with self.producers.acquire() as producer:
            producer.publish(
                data,
                exchange=exchange,
                routing_key=routing_key,
                delivery_mode=PERSISTENT,
                headers=dict(headers or {}),
                declare=declare or [],
                retry=True,
                retry_policy=RETRY_POLICY,
                **kwargs,
            )

    def publish_public(self, event_type: str, body: Mapping[str, Any], run_id: str) -> None:
        self.publish_json(self.topology.public, event_type,
                          redact({"type": event_type, "run_id": run_id, **body}), declare=[self.topology.public])

    def reply(self, reply_to: str, correlation_id: str | None, answer: BaseModel) -> None:
        """A Result (or an approval's answer) to a client's reply queue (default exchange, routing key = queue
        name)."""
        self.publish_json("", reply_to, answer.model_dump(mode="json"), correlation_id=correlation_id)

    def dead_letter(
        self,
        body: bytes | Mapping[str, Any],
        *,
        reason: str,
        error_code: str,
        source: str,
        headers: Mapping[str, Any] | None = None,
        correlation_id: str | None = None,
        original_exchange: str = "",
        original_routing_key: str = "",
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        """Keep a message we cannot handle, with why and where it came from, in the dead-letter queue.

        The original body, properties (content type, encoding, reply_to) and the client's own
        headers are kept so ``agentfleet dlq replay`` can send it back as it was; headers the
        broker sets when it dead-letters, and any ``x-agentfleet-*`` a client set itself, are not.
        """
        reason = redact(reason)  # the body is kept as it was, for replay; the reason is shown to people
        extra = {
            **client_headers(headers),
            C.HEADER_DEAD_REASON: reason[:1000],
            C.HEADER_DEAD_ERROR_CODE: str(error_code),
            C.HEADER_DEAD_SOURCE: source[:255],
            C.HEADER_DEAD_EXCHANGE: original_exchange,
            C.HEADER_DEAD_ROUTING_KEY: original_routing_key[:255],
            C.HEADER_DEAD_AT: datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        props = {"message_id": uuid.uuid4().hex, **{k: v for k, v in (properties or {}).items() if v}}
        log.warning("dead-lettered", extra={"reason": reason[:1000], "error_code": str(error_code),
                                            "source": source[:255], "message_id": props["message_id"]})
        self.publish_json(self.topology.dead, source[:255], body, headers=extra, correlation_id=correlation_id,
                          declare=[self.topology.dead_queue], properties=props)


    def dead_letter_event(self, env: Envelope, *, reason: str, error_code: str) -> None:
        """Keep an internal event with the reason; ``dlq replay`` sends it back as the task it was."""
        self.dead_letter(env.model_dump_json().encode(), reason=reason, error_code=error_code,
                         source=f"task:{env.type}", original_exchange=self.topology.events.name,
                         original_routing_key=str(env.type))


CONFIRM_TIMEOUT_S = 30.0  # how long a batch waits for the broker's confirms before it is sent again


class _BatchChannel:
    """A channel of the publisher's own on a pooled connection: in confirm mode, publishing without waiting, and
    counting what it published, so the confirms of a batch are known by their delivery tags (the broker numbers
    a channel's publishes from 1; on a shared channel the count would be unknown).

    Confirms are counted by the channel's listeners, whoever reads them off the connection: py-amqp reads what the
    broker sent before each publish (to notice a blocked connection), so a confirm of an earlier message of a batch
    is often read while the batch is still being sent, when no wait is pending. A wait's one-shot callback missed
    those, and the batch waited ``CONFIRM_TIMEOUT_S`` for a confirm that had come (``_confirmed_batch``).
    """

    def __init__(self, connection: Any) -> None:
        self.channel = connection.channel()
        self.channel.confirm_select()
        self.channel.basic_publish = self.channel._basic_publish  # confirms are awaited by ``_confirmed_batch``
        self.published = 0
        self.through = 0  # every delivery tag up to this one is confirmed
        self.acked: set[int] = set()  # confirmed one by one, past ``through``
        self.nacked: set[int] = set()  # refused (a ``multiple`` refusal: every unconfirmed tag up to its own)
        self.channel.events["basic_ack"].add(self._ack)
        self.channel.events["basic_nack"].add(self._nack)

    def _ack(self, delivery_tag: int, multiple: bool = False) -> None:
        if multiple:
            self.through = max(self.through, delivery_tag)
            self.acked = {tag for tag in self.acked if tag > self.through}
        else:
            self.acked.add(delivery_tag)
        while self.through + 1 in self.acked:
            self.through += 1
            self.acked.discard(self.through)

    def _nack(self, delivery_tag: int, multiple: bool = False) -> None:
        tags = range(self.through + 1, delivery_tag + 1) if multiple else (delivery_tag,)
        self.nacked.update(tag for tag in tags if tag not in self.acked)  # what is confirmed stays confirmed

    def refused(self, first: int, last: int) -> list[int]:
        """Delivery tags between ``first`` and ``last`` the broker refused (forgotten once asked)."""
        found = sorted(tag for tag in self.nacked if first <= tag <= last)
        self.nacked = {tag for tag in self.nacked if tag > last}
        return found


_batch_channels: weakref.WeakKeyDictionary[Any, _BatchChannel] = weakref.WeakKeyDictionary()
os.register_at_fork(after_in_child=_batch_channels.clear)  # a forked child opens its own connections


def _confirmed_batch(producer: Producer, messages: list[tuple[Any, dict[str, Any]]]) -> None:
    """Publish every message, then wait until the broker has confirmed them all (a nack raises)."""
    transport = producer.connection.connection  # the live AMQP connection: a new one after a reconnect
    own = _batch_channels.get(transport)
    if own is None or not own.channel.is_open:
        own = _batch_channels[transport] = _BatchChannel(transport)
    sender = Producer(own.channel, auto_declare=False)
    first = own.published + 1
    for body, options in messages:
        sender.publish(body, **options)
        own.published += 1
    last = own.published
    deadline = time.monotonic() + CONFIRM_TIMEOUT_S
    while True:
        if refused := own.refused(first, last):
            raise MessageNacked(f"the broker refused event messages (delivery tags {refused})")
        if own.through >= last:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the broker confirmed event messages through {own.through} of {first}..{last}")
        # Returns once any confirm is read (the listeners count it); what was read before is counted already.
        own.channel.wait([spec.Basic.Ack, spec.Basic.Nack], timeout=remaining)


def client_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """A client's headers worth keeping on a dead letter: plain values, none the broker or we would set."""
    kept: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        if not isinstance(key, str) or key.startswith(C.HEADER_PREFIX) or key.startswith(C.BROKER_DEATH_HEADERS):
            continue
        if isinstance(value, str | int | float | bool) and not (isinstance(value, str) and len(value) > 1000):
            kept[key] = value
    return kept


def tool_queue_status(app: Celery, topology: Topology, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Each dedicated tool queue's ready messages and consumers, as the broker counts them (a queue it does not
    have: none of either); all are left out when the broker cannot be asked."""
    found: dict[str, tuple[int, int]] = {}
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
            for name in names:
                channel = conn.channel()
                try:
                    ok = topology.tool_queue(name).bind(channel).queue_declare(passive=True)
                    found[name] = (ok.message_count, ok.consumer_count)
                except Exception:  # NOT_FOUND (it closes the channel; the next queue gets one of its own)
                    found[name] = (0, 0)  # nothing consumes a queue that is not there: a call sent to it is lost
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()
    except Exception as exc:
        log.warning("tool queue consumers unknown: %s", exc)
    return found


def queue_depths(app: Celery, topology: Topology) -> dict[str, int]:
    """Messages ready in each role's queue (unknown, if the broker is away: none). Needs only the broker: the
    sweeper reads it once per sweep, `agentfleet workers` on a machine without the agents' code too."""
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            return {role: queue.bind(channel).queue_declare(passive=True).message_count
                    for role, queue in topology.role_queues.items()}
    except Exception as exc:
        log.warning("queue depths unknown: %s", exc)
        return {}
