"""The event envelope and the core catalogue (DESIGN.md 3.3).

Each internal message is a Celery task message: task name = routing key = event
type, task id = event id, and its one keyword argument is the envelope.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentfleet.errors import MalformedEvent
from agentfleet.events.contracts import validation_problems
from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import ToolCall, ToolResult

SCHEMA_VERSION = 1
FLEET_RUN_ID = "fleet"  # the run_id of events about the fleet rather than one run (tool.health_changed)


class EventType(StrEnum):
    GOAL_SUBMITTED = "goal.submitted"
    TOOL_REQUESTED = "tool.requested"
    TOOL_COMPLETED = "tool.completed"
    TOOL_FAILED = "tool.failed"
    OBSERVATION_RECORDED = "observation.recorded"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    TOOL_HEALTH_CHANGED = "tool.health_changed"
    DELEGATION_STARTED = "delegation.started"
    DOMAIN_EVENT = "domain.event"


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str = Field(min_length=1, max_length=64)
    type: EventType
    run_id: str = Field(min_length=1, max_length=64)
    trace_id: str = Field(min_length=1, max_length=64)
    causation_id: str | None = None
    occurred_at: datetime
    schema_version: int = SCHEMA_VERSION
    payload: dict[str, Any]

    @classmethod
    def new(
        cls,
        type: EventType,
        run_id: str,
        payload: BaseModel,
        *,
        trace_id: str,
        event_id: str | None = None,
        causation_id: str | None = None,
    ) -> Envelope:
        return cls(
            event_id=event_id or str(uuid.uuid4()),
            type=type,
            run_id=run_id,
            trace_id=trace_id,
            causation_id=causation_id,
            occurred_at=datetime.now(UTC),
            payload=payload.model_dump(mode="json"),
        )

    def body(self) -> BaseModel:
        """The payload as its typed model; MalformedEvent if it does not fit."""
        model = PAYLOADS.get(self.type)
        if model is None:
            raise MalformedEvent(f"no payload model for {self.type}")
        try:
            return model.model_validate(self.payload)
        except ValidationError as exc:
            raise MalformedEvent(f"{self.type} payload invalid: {validation_problems(exc)}") from None

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


_ENVELOPE_JSON = Envelope.__pydantic_serializer__


def envelope_json(env: Envelope) -> bytes | None:
    """The envelope as JSON, written in one pass by pydantic's serializer from the model (``wire`` and then the json
    module cost ~22 µs an event, this ~6: benchmarks/README.md, issue 23). None when it holds text UTF-8 cannot carry
    (a lone surrogate): the caller takes that way, whose escapes carry it. Both a task message's body and an outbox
    are written by it."""
    try:
        return _ENVELOPE_JSON.to_json(env)
    except ValueError:  # pydantic_core's PydanticSerializationError: not encodable as UTF-8
        return None


def stored_form(env: Envelope) -> Envelope:
    """The event as an outbox keeps it: without the payload's routing hints (``ROUTING_HINTS``). They say where the
    event is best handled (the process that holds its run) and how the run was left, which saves that process a read;
    a copy sent again later (a duplicate delivery's, the sweeper's) goes to its role's queue, where the run is read,
    as for an event from a process that knew nothing. Each hint-bearing event stored is a third to half smaller
    (benchmarks/README.md, issue 23)."""
    hints = ROUTING_HINTS.get(env.type)
    if hints is None or hints.isdisjoint(env.payload):
        return env
    return env.model_copy(update={"payload": {k: v for k, v in env.payload.items() if k not in hints}})


def outbox_json(events: Sequence[Envelope]) -> str | None:
    """The events as one JSON array, as an outbox stores them (``stored_form``, then ``envelope_json`` each); None as
    there."""
    encoded = [envelope_json(stored_form(e)) for e in events]
    return None if None in encoded else (b"[" + b",".join(encoded) + b"]").decode()  # type: ignore[arg-type]


def stored_outbox(events: Sequence[Envelope]) -> str | list[dict[str, Any]]:
    """What a dedupe mark stores of the events a handling produced: their stored forms as one JSON array
    (``outbox_json``), or as ``wire`` dicts where text UTF-8 cannot carry makes that None. Every stored outbox is
    written this way, a step's and the sweeper's alike."""
    encoded = outbox_json(events)
    return encoded if encoded is not None else [stored_form(e).wire() for e in events]


def decode(raw: Any) -> Envelope:
    try:
        return Envelope.model_validate(raw)
    except ValidationError as exc:
        raise MalformedEvent(f"envelope invalid: {validation_problems(exc)}") from None


# A process's token names its own queue (``<ns>.<role>.<token>``), and a queue's name is at most 255 bytes.
TOKEN_MAX = 200


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParentCall(_Payload):
    """The call of a parent run a child run answers (a delegation)."""

    run_id: str
    agent: str
    iteration: int
    call_id: str
    sibling_call_ids: list[str]
    ancestors: list[str] = Field(default_factory=list)  # the root first, down to this parent: one budget


class GoalSubmitted(_Payload):
    agent: str
    goal_id: str
    input: dict[str, Any]
    limits: dict[str, Any] = Field(default_factory=dict)
    reply_to: str | None = None
    correlation_id: str | None = None
    parent: ParentCall | None = None  # set for a delegated goal: whose call its Result answers
    cause: dict[str, Any] | None = None  # set for a triggered goal: the domain event that started it
    progress: bool = False  # announce the run's steps on <ns>.public (the goal asked, or its parent run did)
    thread_id: str | None = None  # the conversation it continues
    # A run retried or forked from another (ops/lineage.py): {"kind", "run_id", "through"}; it starts at iteration
    # through + 1 from that run's transcript, with ``carried``: the results of the source's last calls, as recorded.
    lineage: dict[str, Any] | None = None
    carried: list[dict[str, Any]] = Field(default_factory=list)


class RunLeft(_Payload):
    """The run as the commit that sent a call out left it (its planner's), carried to the observer that fans the
    call's result in, which then holds the run as this instead of reading it (``RunsLeft.finished``; one round trip
    fewer an iteration, issue 23). Only ever a guess: the observer's transaction checks the row's version, state,
    iteration and everything written to it without a move (``store/runs.py`` ``UNVERSIONED``, all of which is here)
    with its COMMIT, and reads the run when it is not so. The rest of the row is the same at one version wherever it
    is known: the observer knows it from a commit of its own process at ``version``, or at ``from_version`` when the
    planner vouches that its moves since changed nothing but what is here."""

    version: int
    state: RunState
    iteration: int
    updated_at: datetime
    from_version: int | None = None  # the observer's move the planner's handling moved on from, when it did
    steps_used: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cached_input_tokens: int
    unpriced: bool
    reserved_tokens: int
    reserved_cost_usd: float
    reserved_steps: int
    thread_seq: int | None
    redrives: int
    redriven_at: datetime | None


class ToolRequested(_Payload):
    agent: str
    iteration: int
    call: ToolCall
    sibling_call_ids: list[str]  # every call of this iteration, for the observer's fan-in
    idempotency_key: str
    approval_id: str | None = None  # sent again once a person answered: the answer decides, not the policy
    deadline_at: float | None = None  # the run's deadline (epoch seconds): the call stops there, like a cancel
    queue: str | None = None  # the tool's dedicated queue (``@tool(queue=...)``), which the call is published to
    progress: bool = False  # the run announces its steps: so does the executor, for this call
    run_left: RunLeft | None = None  # the run as the commit that sent the call left it: for the observer
    # The tokens of the planner process that sent the call and of the observer that moved the run before it: the
    # call's result goes back to that observer, and the observation to that planner (``Topology.route``).
    planner: str | None = Field(default=None, max_length=TOKEN_MAX)
    observer: str | None = Field(default=None, max_length=TOKEN_MAX)


class ToolFinished(_Payload):
    """Payload of both tool.completed and tool.failed."""

    agent: str
    iteration: int
    call_id: str
    tool: str
    sibling_call_ids: list[str]
    result: ToolResult
    attempt: int = 1
    worker: str | None = None
    run_left: RunLeft | None = None  # the request's, passed on as it came
    planner: str | None = Field(default=None, max_length=TOKEN_MAX)  # the request's, passed on as it came
    observer: str | None = Field(default=None, max_length=TOKEN_MAX)  # the request's, passed on as it came


class Observation(_Payload):
    call_id: str
    tool: str
    result: ToolResult


class ObservationRecorded(_Payload):
    agent: str
    iteration: int
    observations: list[Observation]
    # Set when the planner told an unusable turn back to the model: what to do instead (a user message).
    repair: str | None = None
    # The planner process that planned the iteration, when known: the observation is published to it. And the observer
    # process that sent it, which holds the run as its move left it: the next iteration's call results go back there.
    planner: str | None = Field(default=None, max_length=TOKEN_MAX)
    observer: str | None = Field(default=None, max_length=TOKEN_MAX)


class RunCancelRequested(_Payload):
    reason: str = "cancelled by request"


class RunEnded(_Payload):
    """Payload of run.completed and run.failed: the public Result."""

    result: dict[str, Any]
    redelivery: bool = False  # a later copy of the goal asked for the result again
    thread_id: str | None = None  # the run's thread: its end gives the thread's next run its turn
    lineage: dict[str, Any] | None = None  # retried or forked from (shown on the public exchange)


class ToolHealthChanged(_Payload):
    """A tool's health or breaker changed (a fleet fact, not a run's: its envelope's run_id is FLEET_RUN_ID)."""

    tool: str
    kind: Literal["check", "breaker"]
    status: Literal["healthy", "down", "open", "half_open", "closed"]
    detail: str | None = None
    at: datetime
    by: str


class ApprovalRequested(_Payload):
    """A call was parked for a person (the request itself is a row of the approvals table)."""

    approval_id: str
    agent: str
    iteration: int
    call_id: str
    tool: str
    sibling_call_ids: list[str]


class ApprovalResolved(_Payload):
    """A request was answered (approved, denied, or expired); the observer sends the call on."""

    approval_id: str
    iteration: int
    call_id: str
    decision: Literal["approved", "denied", "expired"]


class DelegationStarted(_Payload):
    """A delegated call handed its goal to a child run; the parent may now wait on its children."""

    agent: str
    iteration: int
    call_id: str
    child_run_id: str
    sibling_call_ids: list[str]


class DomainEvent(_Payload):
    """A domain event (``domain.<name>``): published by a run's tool through its step, or from outside."""

    name: str
    event_id: str
    payload: dict[str, Any]
    source: Literal["run", "external"]
    step_key: str | None = None  # the step that published it (source "run"; the envelope's run_id is its run)


PAYLOADS: dict[EventType, type[BaseModel]] = {
    EventType.GOAL_SUBMITTED: GoalSubmitted,
    EventType.TOOL_REQUESTED: ToolRequested,
    EventType.TOOL_COMPLETED: ToolFinished,
    EventType.TOOL_FAILED: ToolFinished,
    EventType.OBSERVATION_RECORDED: ObservationRecorded,
    EventType.APPROVAL_REQUESTED: ApprovalRequested,
    EventType.APPROVAL_RESOLVED: ApprovalResolved,
    EventType.RUN_CANCEL_REQUESTED: RunCancelRequested,
    EventType.RUN_COMPLETED: RunEnded,
    EventType.RUN_FAILED: RunEnded,
    EventType.TOOL_HEALTH_CHANGED: ToolHealthChanged,
    EventType.DELEGATION_STARTED: DelegationStarted,
    EventType.DOMAIN_EVENT: DomainEvent,
}

# The payload fields that only route an event to the process holding its run and tell that process how the run was
# left (``Topology.route``, ``RunsLeft``): a receiver without them reads the run. A stored outbox leaves them out
# (``stored_form``). By event type, as each payload model declares them.
_HINTS = frozenset({"run_left", "planner", "observer"})
ROUTING_HINTS: dict[EventType, frozenset[str]] = {
    type_: hints for type_, model in PAYLOADS.items() if (hints := _HINTS & model.model_fields.keys())
}
