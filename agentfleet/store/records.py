"""The records the store hands out, read from rows: plain frozen data, no connection."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

from agentfleet.loop.budgets import DEFAULT_DEADLINE_S
from agentfleet.loop.states import TERMINAL, RunState
from agentfleet.loop.transcript import Usage
from agentfleet.redaction import redact
from agentfleet.store import tables as T

ARTIFACT_CHUNK = 1 << 20  # bytes a row of artifact_chunks holds


Payload = bytes | BinaryIO  # an artifact's content: bytes, or a file the store streams in


def now() -> datetime:
    return datetime.now(UTC)


def as_utc(ts: datetime | None) -> datetime | None:
    """SQLite drops the zone; we only ever store UTC."""
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    agent: str
    goal_id: str
    trace_id: str
    state: RunState
    version: int
    iteration: int
    input: dict[str, Any]
    limits: dict[str, Any]
    steps_used: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    result: dict[str, Any] | None
    error_code: str | None
    created_at: datetime
    updated_at: datetime
    redrives: int = 0
    redriven_at: datetime | None = None
    cached_input_tokens: int = 0
    unpriced: bool = False
    parent_run_id: str | None = None
    parent: dict[str, Any] | None = None
    cause: dict[str, Any] | None = None
    reserved_tokens: int = 0
    reserved_cost_usd: float = 0.0
    reserved_steps: int = 0
    progress: bool = False  # its steps are announced on <ns>.public (the goal asked, or a parent run did)
    thread_id: str | None = None  # the conversation it continues
    thread_seq: int | None = None  # its place in that thread
    started_at: datetime | None = None  # when it got its thread's turn, if it waited for one
    lineage: dict[str, Any] | None = None  # retried or forked from: {"kind", "run_id", "through"}
    lineage_run_id: str | None = None

    def replace(self, **changes: Any) -> RunRecord:
        """A copy with ``changes``: ``dataclasses.replace``, without running ``__init__``. A frozen dataclass's
        ``__init__`` sets each of these 32 fields through ``object.__setattr__``: ~11 µs a copy, and a planner's
        handling copies a run six times (benchmarks/README.md, issue 23). A copy of the fields here costs ~2 µs.
        An unknown name is refused, as ``dataclasses.replace`` refuses it."""
        unknown = changes.keys() - _RUN_FIELDS
        if unknown:
            raise TypeError(f"RunRecord has no field {', '.join(sorted(unknown))}")
        copied = object.__new__(RunRecord)
        fields = copied.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return copied

    @property
    def began_at(self) -> datetime:
        """When its time started: its thread's turn, if it waited for one; else its creation."""
        return self.started_at or self.created_at

    @classmethod
    def from_row(cls, row: Any) -> RunRecord:
        return cls.from_mapping(dict(row._mapping))

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> RunRecord:
        """A run from its columns by name (a Core row's mapping, or ``store.sql`` values zipped with names)."""
        data["state"] = RunState(data["state"])
        for key in ("created_at", "updated_at", "redriven_at", "started_at"):
            if key in data:
                data[key] = as_utc(data[key])
        return cls(**data)

    @property
    def usage(self) -> Usage:
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens, cost_usd=self.cost_usd,
                     cached_input_tokens=self.cached_input_tokens, unpriced=self.unpriced)

    def usage_summary(self) -> dict[str, Any]:
        """The run's usage as a Result and ``agentfleet status`` report it."""
        return {"steps": self.steps_used, "tokens": self.input_tokens + self.output_tokens, "cost_usd": self.cost_usd,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_input_tokens": self.cached_input_tokens, "unpriced": self.unpriced}

    def elapsed_s(self) -> float:
        return (now() - self.began_at).total_seconds()

    def deadline_at(self) -> datetime:
        """When the run's wall-time budget ends (a delegated run's limits are already within its ancestors')."""
        return self.began_at + timedelta(seconds=float(self.limits.get("deadline_s") or DEFAULT_DEADLINE_S))

    def past_deadline(self) -> bool:
        return now() >= self.deadline_at()

    @property
    def ancestors(self) -> list[str]:
        """The runs above a delegated run, the root first: each counts this run's spend in its own."""
        if not self.parent:
            return []
        return list(self.parent.get("ancestors") or [self.parent["run_id"]])


_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunRecord))


@dataclass(frozen=True)
class StepRecord:
    idempotency_key: str
    status: str
    attempts: int
    output: Any
    fresh: bool  # this call created the intent (no earlier attempt)
    input: Any = None  # what the intent recorded (the first attempt's)


@dataclass(frozen=True)
class ApprovalRecord:
    """A tool call parked for a person's answer, and the answer once there is one."""

    approval_id: str
    run_id: str
    iteration: int
    call_id: str
    agent: str
    tool: str
    arguments: dict[str, Any]
    shown: dict[str, Any]
    args_schema: dict[str, Any]
    request: dict[str, Any]
    rule: str
    reason: str
    status: str
    requested_at: datetime
    expires_at: datetime | None
    resolved_at: datetime | None
    resolved_by: str | None
    note: str | None
    edited_arguments: dict[str, Any] | None
    sent_at: datetime | None
    applied_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> ApprovalRecord:
        data = {k: v for k, v in row._mapping.items() if k in cls.__dataclass_fields__}
        for key in ("requested_at", "expires_at", "resolved_at", "sent_at", "applied_at"):
            data[key] = as_utc(data[key])
        return cls(**data)

    @property
    def pending(self) -> bool:
        return self.status == APPROVAL_PENDING

    def summary(self) -> dict[str, Any]:
        """What people see: the arguments (and any edits) with secrets masked."""
        data = dataclasses.asdict(self)
        for key in ("arguments", "args_schema", "request"):
            data.pop(key)
        if self.edited_arguments is not None:
            data["edited_arguments"] = redact(self.edited_arguments, self.args_schema)
        return data


APPROVAL_PENDING = "pending"


LIVE = T.runs.c.state.notin_([s.value for s in TERMINAL])  # a run not yet ended
