"""The public wire contracts: goals in, Results out, notices on the public exchange (DESIGN.md 3.1, 3.2).

These are what other languages see; ``agentfleet schema`` exports them as JSON Schema.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentfleet.constants import MAX_JSON_DEPTH
from agentfleet.errors import RECOVERY_SUGGESTIONS, AgentfleetError, ErrorCode, GoalRejected
from agentfleet.events.wire import check_plain, loads_strict
from agentfleet.loop.budgets import CallsPerTurn, CostUsd, Repairs, Seconds, Steps, Tokens
from agentfleet.loop.keys import RESERVED_GOAL_PREFIXES

M = TypeVar("M", bound=BaseModel)

# Identifiers end up in varchar columns, log lines and AMQP headers: printable text only.
PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


class GoalLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: Steps | None = None
    max_tokens: Tokens | None = None
    max_cost_usd: CostUsd | None = None
    deadline_s: Seconds | None = None
    max_repairs: Repairs | None = None
    max_calls_per_turn: CallsPerTurn | None = None

    def requested(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Goal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=128, pattern=PRINTABLE)
    input: dict[str, Any]
    goal_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=PRINTABLE)
    limits: GoalLimits = Field(default_factory=GoalLimits)
    thread_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=PRINTABLE, description=(
        "Continue this conversation: the run starts from what the thread's earlier runs left (their goals and "
        "answers, as much as fits), and waits for the thread's run before it to end"))
    progress: bool = Field(default=False, description=(
        "Announce the run's steps (and its delegated children's) on <ns>.public: step.planned, tool.started, "
        "tool.finished, run.waiting"))

    @field_validator("goal_id")
    @classmethod
    def _not_reserved(cls, goal_id: str | None) -> str | None:
        """Child and triggered runs' ids derive from these: an outside goal there could take a child's run
        before its parent starts it, or pose as one on the public exchange."""
        if goal_id is not None and goal_id.startswith(RESERVED_GOAL_PREFIXES):
            raise ValueError(f"goal ids starting {' or '.join(RESERVED_GOAL_PREFIXES)} are reserved for the "
                             "runs the fleet starts itself")
        return goal_id


class ResultStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


class ResultUsage(BaseModel):
    """What a run spent. ``cost_usd`` counts priced model calls only: ``unpriced`` says some call's model
    has no entry in the price table (AGENTFLEET_MODEL_PRICES), so the true cost is higher, not $0."""

    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0  # of input_tokens, served from the provider's prompt cache
    unpriced: bool = False


class Result(BaseModel):
    status: ResultStatus
    run_id: str | None = None
    goal_id: str | None = None
    agent: str | None = None
    output: dict[str, Any] | None = None
    error_code: ErrorCode | None = None
    message: str | None = None
    recovery_suggestion: str | None = None
    usage: ResultUsage = Field(default_factory=ResultUsage)

    @classmethod
    def rejection(cls, code: ErrorCode, message: str, *, agent: str | None = None,
                  goal_id: str | None = None) -> Result:
        return cls(status=ResultStatus.REJECTED, agent=agent, goal_id=goal_id, error_code=code,
                   message=message, recovery_suggestion=RECOVERY_SUGGESTIONS.get(code))


def parse_goal(body: bytes | str | dict[str, Any], routing_key: str | None = None, *,
               max_depth: int = MAX_JSON_DEPTH, encoding: str | None = None) -> Goal:
    """A goal from the wire, or GoalRejected saying exactly what is wrong with it."""
    data = _plain_object(body, max_depth, encoding)
    if "agent" not in data and routing_key and routing_key.startswith("goal."):
        data = {**data, "agent": routing_key.removeprefix("goal.")}
    return _validated(Goal, data, "goal")


def parse_plain(model: type[M], body: bytes | str | dict[str, Any], *, max_depth: int = MAX_JSON_DEPTH,
                encoding: str | None = None, what: str) -> M:
    """A plain-JSON message of ``model``'s shape from the wire, or GoalRejected saying what is wrong."""
    return _validated(model, _plain_object(body, max_depth, encoding), what)


def plain_object(body: bytes | str | dict[str, Any], max_depth: int, encoding: str | None) -> dict[str, Any]:
    """A JSON object from the wire within the inbox's limits, or GoalRejected saying what is wrong."""
    return _plain_object(body, max_depth, encoding)


def _plain_object(body: bytes | str | dict[str, Any], max_depth: int, encoding: str | None) -> dict[str, Any]:
    try:
        if isinstance(body, bytes | str):
            data = loads_strict(body, max_depth=max_depth, encoding=encoding)
        else:
            check_plain(body, max_depth=max_depth)
            data = body
    except AgentfleetError as exc:
        raise GoalRejected(exc.message, code=exc.code) from None
    if not isinstance(data, dict):
        raise GoalRejected("body is not a JSON object", code=ErrorCode.MALFORMED_MESSAGE)
    return data


def validation_problems(exc: ValidationError, limit: int = 5) -> str:
    """Where and why a model refused data, never the values it was given: they may be a tool's secret-marked
    arguments, which log redaction (names and patterns) cannot tell from other text. Raise with ``from None``: the
    pydantic error's own text quotes the input."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                     for e in exc.errors(include_url=False, include_input=False)[:limit])


def _validated(model: type[M], data: dict[str, Any], what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise GoalRejected(f"not a valid {what}: {validation_problems(exc)}",
                           code=ErrorCode.MALFORMED_MESSAGE) from None


class ToolHealthNotice(BaseModel):
    """A tool's health or breaker changed: plain JSON on ``<ns>.public``, routing key ``tool.health_changed``."""

    type: Literal["tool.health_changed"] = "tool.health_changed"
    tool: str
    kind: Literal["check", "breaker"]
    status: Literal["healthy", "down", "open", "half_open", "closed"]  # check: healthy|down; breaker: the rest
    detail: str | None = None
    time: datetime
    by: str  # the worker that saw it (host:pid)


class RunNotice(Result):
    """A run's end: plain JSON on ``<ns>.public``, routing key ``run.completed`` or ``run.failed``. Its Result,
    the trace it belongs to and, for a delegated run, its parent's run and call: enough for any AMQP client
    to draw the tree of agents a goal became."""

    type: Literal["run.completed", "run.failed"]
    trace_id: str
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    lineage: dict[str, Any] | None = Field(default=None, description=(
        "A run retried or forked from another: {kind: retry|fork, run_id, through: the iteration of that run's "
        "transcript it started from}"))


class GraphStepNotice(BaseModel):
    """A step of a graph run: plain JSON on ``<ns>.public``, routing key ``graph.step``, as the step's nodes are
    handed out. The nodes it runs (none: the graph's end), each edge judged to get there and whether it held, and
    the nodes of the step before that failed with what followed (a retry, a fallback, a skip)."""

    type: Literal["graph.step"] = "graph.step"
    run_id: str
    trace_id: str
    graph: str
    step: int
    nodes: list[str]
    edges: list[dict[str, Any]] = Field(default_factory=list)
    failed: list[dict[str, Any]] = Field(default_factory=list)


class _StepNotice(BaseModel):
    """What a run whose goal asked for ``progress`` (and each of its delegated children) says of its steps: plain
    JSON on ``<ns>.public``, routing key = ``type``, secrets masked. Sent once the step it tells of is committed, in
    the order the steps happen (each is published, confirmed, before the event that starts the next); a step
    redone after a crash may be told twice, and a notice lost to a broker outage is not sent again: the run's
    trace (``agentfleet trace``) is the record, this is the view."""

    run_id: str
    trace_id: str
    agent: str
    iteration: int
    at: datetime
    parent_run_id: str | None = None


class PlannedCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]  # secrets masked


class StepPlannedNotice(_StepNotice):
    """``step.planned``: the model's turn — the calls it made (``final_answer`` among them when it ends the run),
    the start of what it wrote, and what the turn cost."""

    type: Literal["step.planned"] = "step.planned"
    calls: list[PlannedCall]
    text: str | None = None  # its first 500 characters
    input_tokens: int
    output_tokens: int
    duration_ms: float


class ToolStartedNotice(_StepNotice):
    """``tool.started``: an executor is about to run a call (not sent for a result served again)."""

    type: Literal["tool.started"] = "tool.started"
    call_id: str
    tool: str
    worker: str


class ToolFinishedNotice(_StepNotice):
    """``tool.finished``: a call's outcome, with its error code when it failed."""

    type: Literal["tool.finished"] = "tool.finished"
    call_id: str
    tool: str
    ok: bool
    error_code: str | None = None
    duration_ms: float | None = None


class RunWaitingNotice(_StepNotice):
    """``run.waiting``: the run waits for a person's answer (``approval``) or for the runs it delegated to."""

    type: Literal["run.waiting"] = "run.waiting"
    waiting_for: Literal["approval", "children"]


StepNotice = StepPlannedNotice | ToolStartedNotice | ToolFinishedNotice | RunWaitingNotice
STEP_NOTICES: dict[str, type[_StepNotice]] = {"step.planned": StepPlannedNotice, "tool.started": ToolStartedNotice,
                                              "tool.finished": ToolFinishedNotice, "run.waiting": RunWaitingNotice}


class DomainNotice(BaseModel):
    """A domain event as recorded: plain JSON on ``<ns>.public``, routing key ``domain.<name>``."""

    type: str  # domain.<name>
    event_id: str
    payload: dict[str, Any]
    source: Literal["run", "external"]
    run_id: str | None = None  # the run whose step published it (source "run")
    trace_id: str


Decision = Literal["approved", "denied", "expired"]


class ApprovalResolve(BaseModel):
    """An answer to an approval request: plain JSON to ``<ns>.inbox``, routing key ``approval.resolve``.

    Who answered is the message's ``user_id`` property, which RabbitMQ checks against the connection's
    user; an answer without it is refused (PERMISSION_DENIED). ``by`` is kept beside it when it names
    someone else ("guest (as carol)"), never instead of it. ``arguments`` (with ``approve`` only) replace
    the call's arguments and must fit the tool's schema, or the answer is refused and the request stays
    pending.
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(min_length=1, max_length=64, pattern=PRINTABLE)
    call_id: str = Field(min_length=1, max_length=128, pattern=PRINTABLE)
    decision: Literal["approve", "deny"]
    note: str | None = Field(default=None, max_length=2000, description="The approver's note, or why it is denied")
    arguments: dict[str, Any] | None = None
    by: str | None = Field(default=None, min_length=1, max_length=255, pattern=PRINTABLE)


class ApprovalNotice(BaseModel):
    """``approval.requested`` and ``approval.resolved``: plain JSON on ``<ns>.public`` (routing key = type)."""

    type: Literal["approval.requested", "approval.resolved"]
    run_id: str
    call_id: str
    iteration: int
    agent: str
    tool: str
    arguments: dict[str, Any]  # secrets masked
    rule: str
    reason: str
    requested_at: datetime
    expires_at: datetime | None = None
    decision: Decision | None = None  # approval.resolved only, as are the fields below
    by: str | None = None
    at: datetime | None = None
    note: str | None = None
    edited: bool = False


class ApprovalAnswer(BaseModel):
    """The reply to an ``approval.resolve`` message (on its ``reply_to``)."""

    type: Literal["approval.answer"] = "approval.answer"
    status: Literal["accepted", "rejected"]
    run_id: str | None = None
    call_id: str | None = None
    decision: Decision | None = None
    by: str | None = None
    error_code: ErrorCode | None = None
    message: str | None = None
    recovery_suggestion: str | None = None

    @classmethod
    def rejection(cls, code: ErrorCode, message: str, **fields: Any) -> ApprovalAnswer:
        return cls(status="rejected", error_code=code, message=message,
                   recovery_suggestion=RECOVERY_SUGGESTIONS.get(code), **fields)
