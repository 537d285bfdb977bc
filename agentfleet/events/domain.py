"""Domain events: facts agents and outside systems publish (``domain.<name>``), and the triggers they fire.

Agents collaborate by publishing and reacting, never by calling each other. A name
may have a JSON Schema (``domain_event``); an event that breaks it is refused. A
``Trigger`` starts an agent from an event: its input is built from the event's
payload by JSON Pointers (or a function), and each (event id, agent) starts one run,
however often the event is delivered. Pure: the observer records, mirrors and starts.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from agentfleet.errors import ConfigurationError
from agentfleet.events.envelope import FLEET_RUN_ID, DomainEvent, Envelope, EventType
from agentfleet.loop.decisions import schema_errors
from agentfleet.loop.keys import TRIGGER_PREFIX, derived_event_id
from agentfleet.loop.pointers import MISSING, argument

NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
MAX_NAME_CHARS = 200  # the column that records it (domain_events.name); the routing key adds "domain."

_schemas: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()


def domain_event(name: str, schema: dict[str, Any]) -> str:
    """Register the JSON Schema every ``name`` event must satisfy (from tools and from outside alike)."""
    _check_name(name)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigurationError(f"domain event {name!r}: its schema is not a valid JSON Schema: {exc.message}"
                                 ) from None
    with _lock:
        if _schemas.get(name, schema) != schema:
            raise ConfigurationError(f"domain event {name!r} is declared twice, differently")
        _schemas[name] = schema
    return name


def problems(name: str, payload: Any) -> list[str]:
    """Why an event may not be published: a bad name, a payload that is not an object or breaks its schema."""
    if not isinstance(name, str) or not NAME.match(name):
        return [f"{name!r} is not an event name (lower-case words separated by dots, e.g. ticket.triaged)"]
    if len(name) > MAX_NAME_CHARS:
        return [f"the event name is {len(name)} characters long; at most {MAX_NAME_CHARS} are allowed"]
    if not isinstance(payload, dict):
        return ["the payload is not a JSON object"]
    schema = _schemas.get(name)
    return schema_errors(schema, payload, limit=5) if schema is not None else []


def event_id_for(*parts: object) -> str:
    """A domain event's id derived from what caused it (a run's step, or an outside message's body)."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Trigger:
    """Start the agent on each ``event``: ``input`` maps goal fields to JSON Pointers into the payload
    (``{"ticket": "/ticket"}``), or is a function of the payload returning the goal input."""

    event: str
    input: Mapping[str, str] | Callable[[dict[str, Any]], dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name(self.event)
        if not callable(self.input):
            for goal_field, pointer in self.input.items():
                if not isinstance(pointer, str) or not (pointer == "" or pointer.startswith("/")):
                    raise ConfigurationError(f"trigger on {self.event!r}: {goal_field!r} maps to {pointer!r}, "
                                             "which is not a JSON Pointer ('/field/sub')")

    def goal_input(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The goal input for this payload (fields whose pointer finds nothing are left out)."""
        if callable(self.input):
            made = self.input(dict(payload))
            return made if isinstance(made, dict) else {"value": made}
        out: dict[str, Any] = {}
        for goal_field, pointer in self.input.items():
            value = payload if pointer == "" else argument(payload, pointer)
            if value is not MISSING:
                out[goal_field] = value
        return out


def external_event_id(name: str, message_id: str | None, body: bytes) -> str:
    """An outside event's id: from the message's ``message_id``, else from its body (sent twice, one event)."""
    return event_id_for("external", name, message_id if message_id else hashlib.sha256(body).hexdigest())


def external_event(name: str, event_id: str, payload: dict[str, Any]) -> Envelope:
    """An outside event as the fleet handles it (its trace begins here: the runs it starts carry it). The
    message's id derives from the event's id and its body: the same event sent twice is one message to the
    observer, and a different body under the same id reaches it (to be refused EVENT_CONFLICT), not deduped
    away as a copy."""
    body = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Envelope.new(EventType.DOMAIN_EVENT, FLEET_RUN_ID, DomainEvent(
        name=name, event_id=event_id, payload=payload, source="external"), trace_id=uuid.uuid4().hex,
        event_id=derived_event_id(event_id, "external", body))


@dataclass(frozen=True)
class Started:
    """What one trigger makes of an event: the goal of the run it starts, or why it starts none."""

    agent: str
    goal_id: str
    input: dict[str, Any]
    problems: list[str]


def started_by(triggers: Iterable[tuple[Any, Trigger]], event_id: str, payload: dict[str, Any]) -> list[Started]:
    """The runs an event's triggers start (``triggers``: (agent, trigger) pairs): one per (event id, agent).
    A trigger whose input breaks its agent's goal schema, or whose function raises, starts none."""
    out = []
    for agent, trigger in triggers:
        try:
            made = trigger.goal_input(payload)
            found = schema_errors(agent.goal_schema, made)
        except Exception as exc:  # a trigger function that raises: its goal cannot be made
            made, found = {}, [f"the trigger's input function raised {type(exc).__name__}: {exc}"]
        out.append(Started(agent.name, trigger_goal_id(event_id, agent.name), made, found))
    return out


def generation_of(cause: Mapping[str, Any] | None) -> int:
    """How many triggers deep a run is: 0 for a goal from outside, n for the nth run of a trigger chain."""
    value = (cause or {}).get("generation", 1 if cause else 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 1


def chain_bound(generation: int, in_trace: int, starting: int, *, max_depth: int, max_runs: int) -> str | None:
    """Why the runs an event's triggers would start (``starting`` of them, ``generation`` deep, beside
    ``in_trace`` runs already in the trace) must not start, or None: they may."""
    if generation > max_depth:
        return (f"this would be generation {generation} of a trigger chain, past trigger_max_depth={max_depth}: "
                "agents are triggering each other in a loop")
    if in_trace + starting > max_runs:
        return (f"the trace already holds {in_trace} runs; {starting} more would pass trace_max_runs={max_runs}")
    return None


def trigger_goal_id(event_id: str, agent: str) -> str:
    """One run per (event id, agent): the goal id a trigger's run gets."""
    return f"{TRIGGER_PREFIX}{event_id}/{agent}"


def conflict(event_id: str, payload: dict[str, Any], recorded: dict[str, Any] | None) -> str | None:
    """Why an event may not be taken under an id already recorded with another payload (a ``message_id``
    reused for a different body): like a goal id, an event id names one fact."""
    if recorded is None or recorded.get("payload") == payload:
        return None
    return (f"event id {event_id} was recorded with a different payload; an event id names one event: send a "
            "different fact with a new message_id")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.match(name) or len(name) > MAX_NAME_CHARS:
        raise ConfigurationError(f"{name!r} is not an event name (lower-case words separated by dots, "
                                 f"e.g. ticket.triaged, at most {MAX_NAME_CHARS} characters)")
