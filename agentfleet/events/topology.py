"""Exchanges, queues and bindings: declared at start-up by every process.

Each core event type has exactly one consuming role. Every consuming queue
dead-letters to ``<ns>.dead``, so a message Celery does not recognise is kept,
not deleted (a process's own queue, below, to its role queue, which does).

A run's next event goes back to the process of its role that holds the run (affinity): ``observation.recorded`` to the
planner that planned the iteration, ``tool.completed`` / ``tool.failed`` to the observer that moved the run last. That
process holds the run (and the planner its transcript) as its last commit left them (``roles/runs_left.py``); any
other must read and lock them first: three round trips instead of one, which made throughput fall with a second
process per role (benchmarks/README.md). Such an event is published to ``<ns>.affinity`` (headers) with the process's
token (``AFFINE``: which payload field names it); each planner and observer process consumes a queue of its own bound
to its token beside its role queue. Nothing waits on a process that is gone: a token no queue is bound to goes to the
exchange's alternate, ``<ns>.events``, and so to the role queue; a message left in a queue whose process stopped moves
to the role queue after ``OWN_QUEUE_WAIT_MS`` (per-queue TTL, dead-lettered there), and the queue itself goes once
unused for ``OWN_QUEUE_EXPIRES_MS``. A process busy past the wait loses only the affinity.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from functools import cached_property

from amqp.exceptions import PreconditionFailed
from kombu import Connection, Exchange, Queue, binding

from agentfleet import constants as C
from agentfleet.events.envelope import TOKEN_MAX, EventType

CONSUMERS: dict[EventType, str] = {
    EventType.GOAL_SUBMITTED: C.PLANNER,
    EventType.OBSERVATION_RECORDED: C.PLANNER,
    EventType.TOOL_REQUESTED: C.EXECUTOR,
    EventType.TOOL_COMPLETED: C.OBSERVER,
    EventType.TOOL_FAILED: C.OBSERVER,
    EventType.RUN_CANCEL_REQUESTED: C.OBSERVER,
    EventType.RUN_COMPLETED: C.OBSERVER,
    EventType.RUN_FAILED: C.OBSERVER,
    EventType.TOOL_HEALTH_CHANGED: C.OBSERVER,  # stored and announced on <ns>.public
    EventType.APPROVAL_REQUESTED: C.OBSERVER,  # announced on <ns>.public; the run may start to wait
    EventType.APPROVAL_RESOLVED: C.OBSERVER,  # announced; the parked call is sent on
    EventType.DELEGATION_STARTED: C.OBSERVER,  # the parent may wait on its children
    EventType.DOMAIN_EVENT: C.OBSERVER,  # recorded, mirrored on <ns>.public, and the triggers it fires started
}
log = logging.getLogger(__name__)

# How long an event waits in a process's own queue before the broker moves it to the role queue (any process of the
# role): what a stopped or overloaded process costs a run at most, against how often a busy one loses the runs it holds.
OWN_QUEUE_WAIT_MS = 3_000
# A process's own queue goes once this long without a consumer: well after every message in it has moved on.
OWN_QUEUE_EXPIRES_MS = 60_000
# The events that go back to the process holding their run, and the payload field naming that process's token
# (``ToolRequested.observer`` and ``ToolFinished.observer`` carry the observer's on).
AFFINE: dict[str, str] = {
    EventType.OBSERVATION_RECORDED: "planner",
    EventType.TOOL_COMPLETED: "observer",
    EventType.TOOL_FAILED: "observer",
}
# The roles whose processes have a queue of their own: those consuming an event of ``AFFINE``.
AFFINE_ROLES = tuple(dict.fromkeys(CONSUMERS[EventType(t)] for t in AFFINE))
# A queue's name is an AMQP short string.
QUEUE_NAME_MAX_BYTES = 255


def consumed_by(role: str) -> list[EventType]:
    return [t for t, r in CONSUMERS.items() if r == role]


@dataclass(frozen=True)
class Topology:
    namespace: str = C.DEFAULT_NAMESPACE
    # Dedicated tool queues the loaded agents' tools name (``@tool(queue=...)``): declared with the rest, so a call
    # published to one is kept until an executor started with ``--queues <name>`` takes it.
    tool_queues: tuple[str, ...] = ()
    # Events back to the process that holds their run (module docstring). Off in the embedded fleet: one
    # process, and kombu's memory transport has no headers exchange.
    affinity: bool = True

    def name(self, suffix: str) -> str:
        return C.exchange_name(self.namespace, suffix)

    @cached_property
    def inbox(self) -> Exchange:
        # A goal whose routing key matches no binding goes to the alternate exchange and is
        # answered from there, instead of being discarded by the broker without a word.
        return Exchange(self.name(C.INBOX), type="topic", durable=True,
                        arguments={"alternate-exchange": self.unroutable.name})

    @cached_property
    def unroutable(self) -> Exchange:
        return Exchange(self.name(C.UNROUTABLE), type="fanout", durable=True)

    @cached_property
    def events(self) -> Exchange:
        return Exchange(self.name(C.EVENTS), type="topic", durable=True)

    @cached_property
    def affine(self) -> Exchange:
        """Events to a process's own queue by its token; a token nobody holds goes on to ``events``."""
        return Exchange(self.name(C.AFFINITY), type="headers", durable=True,
                        arguments={"alternate-exchange": self.events.name})

    def own_token(self, role: str, hostname: str) -> str | None:
        """A new token for a process of ``role``: its hostname (for people reading the broker's list of queues), cut so
        that the token and its queue's name fit (``TOKEN_MAX``, ``QUEUE_NAME_MAX_BYTES``), and a unique part. None when
        the namespace leaves no room even for that: the process then goes without affinity."""
        unique = uuid.uuid4().hex[:12]
        left = QUEUE_NAME_MAX_BYTES - len(f"{C.queue_name(self.namespace, role)}.{unique}".encode())
        if left < 0:
            return None
        room = min(left, TOKEN_MAX - len(unique)) - 1  # the dot between the hostname and ``unique``
        host = hostname.encode()[:room].decode(errors="ignore") if room > 0 else ""
        return f"{host}.{unique}" if host else unique

    def own_queue(self, role: str, token: str) -> Queue:
        """``<ns>.<role>.<token>``: the events of the runs one process of ``role`` holds. What it does not take within
        ``OWN_QUEUE_WAIT_MS`` moves to the role queue; unused, it goes by itself."""
        return Queue(
            f"{C.queue_name(self.namespace, role)}.{token}",
            exchange=self.affine,
            routing_key=token,
            binding_arguments={"x-match": "all", C.HEADER_AFFINITY: token},
            durable=True,
            queue_arguments={"x-message-ttl": OWN_QUEUE_WAIT_MS, "x-expires": OWN_QUEUE_EXPIRES_MS,
                             "x-dead-letter-exchange": "",
                             "x-dead-letter-routing-key": self.role_queues[role].name},
        )

    @cached_property
    def public(self) -> Exchange:
        return Exchange(self.name(C.PUBLIC), type="topic", durable=True)

    @cached_property
    def dead(self) -> Exchange:
        return Exchange(self.name(C.DEAD), type="fanout", durable=True)

    @property
    def _dead_lettered(self) -> dict[str, str]:
        return {"x-dead-letter-exchange": self.dead.name}

    @cached_property
    def role_queues(self) -> dict[str, Queue]:
        return {
            role: Queue(
                C.queue_name(self.namespace, role),
                [binding(self.events, routing_key=str(t)) for t in consumed_by(role)],
                durable=True,
                queue_arguments=self._dead_lettered,
            )
            for role in C.ROLES
        }

    @cached_property
    def inbox_queue(self) -> Queue:
        return Queue(
            C.queue_name(self.namespace, C.INBOX),
            [binding(self.inbox, routing_key=f"{C.GOAL_ROUTING_PREFIX}*"),
             binding(self.inbox, routing_key=C.APPROVAL_RESOLVE_ROUTING_KEY),
             binding(self.inbox, routing_key=f"{C.DOMAIN_ROUTING_PREFIX}#")],
            durable=True,
            queue_arguments=self._dead_lettered,
        )

    @cached_property
    def unroutable_queue(self) -> Queue:
        return Queue(C.queue_name(self.namespace, C.UNROUTABLE), exchange=self.unroutable, routing_key="#",
                     durable=True, queue_arguments=self._dead_lettered)

    @cached_property
    def dead_queue(self) -> Queue:
        return Queue(C.queue_name(self.namespace, C.DEAD), exchange=self.dead, routing_key="#", durable=True)

    def queue_for(self, event_type: EventType) -> Queue:
        return self.role_queues[CONSUMERS[event_type]]

    def tool_queue(self, name: str) -> Queue:
        """``<ns>.executor.<name>``: the calls of tools declared with ``queue=name``, and nothing else."""
        return Queue(C.tool_queue_name(self.namespace, name),
                     [binding(self.events, routing_key=C.tool_routing_key(name))],
                     durable=True, queue_arguments=self._dead_lettered)

    def routing_key(self, event_type: str, payload: dict[str, object]) -> str:
        """An internal event's routing key: its type, which its role's queue binds exactly; a call of a tool with
        a dedicated queue goes under ``tool.requested.<queue>``, which only that queue binds."""
        if event_type == EventType.TOOL_REQUESTED and (queue := payload.get("queue")):
            return C.tool_routing_key(str(queue))
        return event_type

    def route(self, event_type: str, payload: dict[str, object]) -> tuple[str, str, dict[str, str]]:
        """Where an internal event is published: exchange, routing key and the headers routing needs. An event naming
        the process that holds its run (``AFFINE``) goes to ``affine`` under its token; any other to ``events``."""
        routing_key = self.routing_key(event_type, payload)
        field = AFFINE.get(event_type)
        if self.affinity and field is not None and (token := payload.get(field)):
            return self.affine.name, routing_key, {C.HEADER_AFFINITY: str(token)}
        return self.events.name, routing_key, {}

    def all_queues(self) -> list[Queue]:
        return [*self.role_queues.values(), *(self.tool_queue(q) for q in self.tool_queues), self.inbox_queue,
                self.unroutable_queue, self.dead_queue]

    def all_exchanges(self) -> list[Exchange]:
        return [self.dead, self.unroutable, self.inbox, self.events, *([self.affine] if self.affinity else []),
                self.public]

    @property
    def control(self) -> str:
        """Celery's ``control_exchange`` for this namespace (ping, inspect, pool_grow, Flower's buttons)."""
        return self.name(C.CONTROL)

    @property
    def celery_events(self) -> str:
        """Celery's ``event_exchange`` and event queue prefix for this namespace (what Flower watches)."""
        return self.name(C.CELERY_EVENTS)

    def celery_exchanges(self) -> list[Exchange]:
        """The exchanges Celery declares itself for this namespace (as kombu's Mailbox and Celery name them)."""
        return [Exchange(f"{self.control}.pidbox", type="fanout"),
                Exchange(f"reply.{self.control}.pidbox", type="direct"),
                Exchange(self.celery_events, type="topic")]

    def declare(self, connection: Connection) -> None:
        """Declare everything (idempotent). Called by every process at start-up."""
        channel = connection.default_channel
        for exchange in self.all_exchanges():
            try:
                exchange.bind(channel).declare()
            except PreconditionFailed:
                # Declared by a version before the inbox had an alternate exchange: say what to do.
                log.critical("exchange %s exists with other arguments; delete it (management UI or "
                             "rabbitmqadmin) and start again: it is declared anew with the current ones",
                             exchange.name)
                raise
        for queue in self.all_queues():
            queue.bind(channel).declare()

    def delete(self, connection: Connection) -> None:
        """Remove every queue and exchange of the namespace, Celery's too (deleting what is gone is a no-op).

        Workers' own remote-control and event queues are exclusive or expire by themselves.
        """
        channel = connection.default_channel
        for queue in self.all_queues():
            queue.bind(channel).delete()
        for exchange in [*self.all_exchanges(), *self.celery_exchanges()]:
            exchange.bind(channel).delete()
