"""The public wire contracts: goals in, Results out, notices on the public exchange (DESIGN.md 3.1, 3.2).

These are what other languages see; ``agentfleet schema`` exports them as JSON Schema.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentfleet.constants import MAX_JSON_DEPTH
from agentfleet.errors import RECOVERY_SUGGESTIONS, AgentfleetError, ErrorCode, GoalRejected
from agentfleet.events.wire import check_plain, loads_strict
from agentfleet.loop.budgets import CostUsd, Seconds, Steps, Tokens

# Identifiers end up in varchar columns, log lines and AMQP headers: printable text only.
PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


class GoalLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: Steps | None = None
    max_tokens: Tokens | None = None
    max_cost_usd: CostUsd | None = None
    deadline_s: Seconds | None = None

    def requested(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Goal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=128, pattern=PRINTABLE)
    input: dict[str, Any]
    goal_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=PRINTABLE)
    limits: GoalLimits = Field(default_factory=GoalLimits)


class ResultStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


class ResultUsage(BaseModel):
    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


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
    if "agent" not in data and routing_key and routing_key.startswith("goal."):
        data = {**data, "agent": routing_key.removeprefix("goal.")}
    try:
        return Goal.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise GoalRejected(f"not a goal: {problems}", code=ErrorCode.MALFORMED_MESSAGE) from None


class ToolHealthNotice(BaseModel):
    """A tool's health or breaker changed: plain JSON on ``<ns>.public``, routing key ``tool.health_changed``."""

    type: Literal["tool.health_changed"] = "tool.health_changed"
    tool: str
    kind: Literal["check", "breaker"]
    status: Literal["healthy", "down", "open", "half_open", "closed"]  # check: healthy|down; breaker: the rest
    detail: str | None = None
    time: datetime
    by: str  # the worker that saw it (host:pid)
