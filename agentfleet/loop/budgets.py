"""Limits and the termination gates that end a loop for exactly one named reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from agentfleet import constants
from agentfleet.errors import ErrorCode
from agentfleet.loop.transcript import Usage

# The bounds of every limit, shared by an agent's Limits and a goal's requested limits, so the
# inbox refuses exactly what the planner would (a zero budget is refused, not read as "no limit").
Steps = Annotated[int, Field(ge=1, le=10_000)]
Tokens = Annotated[int, Field(ge=1, le=10**12)]
Repairs = Annotated[int, Field(ge=0, le=100)]
CostUsd = Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=30 * 24 * 3600, allow_inf_nan=False)]


class Limits(BaseModel):
    """What one run may spend: model turns (``max_steps``), tokens in and out (``max_tokens``), US dollars
    (``max_cost_usd``) and wall time from its start (``deadline_s``). Checked before each model call; a run
    over one ends ``FAILED`` with ``MAX_STEPS``, ``TOKEN_BUDGET``, ``COST_BUDGET`` or ``DEADLINE``.
    ``max_repairs``: unusable answers the model is told about and asked again, run-wide. An agent
    sets them; a goal may ask for tighter ones (``"limits": {...}``), never looser."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: Steps = constants.DEFAULT_MAX_STEPS
    max_tokens: Tokens = constants.DEFAULT_MAX_TOKENS
    max_cost_usd: CostUsd = constants.DEFAULT_MAX_COST_USD
    deadline_s: Seconds = constants.DEFAULT_DEADLINE_S
    # Answers the model may be asked to give again (each costs a step too), run-wide.
    max_repairs: Repairs = constants.DEFAULT_MAX_REPAIRS

    def tightened_by(self, requested: dict[str, object] | None) -> Limits:
        """A goal may ask for tighter limits than its agent's, never looser ones."""
        if not requested:
            return self
        other = Limits.model_validate({**self.model_dump(), **requested})
        return Limits(
            max_steps=min(self.max_steps, other.max_steps),
            max_tokens=min(self.max_tokens, other.max_tokens),
            max_cost_usd=min(self.max_cost_usd, other.max_cost_usd),
            deadline_s=min(self.deadline_s, other.deadline_s),
            max_repairs=min(self.max_repairs, other.max_repairs),
        )


@dataclass(frozen=True)
class Termination:
    """Why a loop must end now."""

    code: ErrorCode
    message: str


def check_gates(limits: Limits, usage: Usage, iteration: int, elapsed_s: float, steps_used: int = 0
                ) -> Termination | None:
    """Gates checked before each model call; the first that trips names the ending. ``steps_used`` counts
    the steps of the run's finished children too (one budget per tree)."""
    if max(iteration, steps_used) >= limits.max_steps:
        return Termination(ErrorCode.MAX_STEPS, f"reached max_steps={limits.max_steps} without a final answer")
    if usage.total_tokens >= limits.max_tokens:
        return Termination(
            ErrorCode.TOKEN_BUDGET, f"used {usage.total_tokens} tokens of max_tokens={limits.max_tokens}"
        )
    if usage.cost_usd >= limits.max_cost_usd:
        return Termination(
            ErrorCode.COST_BUDGET, f"spent ${usage.cost_usd:.4f} of max_cost_usd={limits.max_cost_usd}"
        )
    if elapsed_s >= limits.deadline_s:
        return Termination(ErrorCode.DEADLINE, f"ran {elapsed_s:.1f}s of deadline_s={limits.deadline_s}")
    return None


def remaining(limits: Limits, usage: Usage, steps_used: int, elapsed_s: float, *, shares: int = 1
              ) -> Limits | Termination:
    """What a child started now may spend: what is left of ``limits`` (its own agent's limits can only
    tighten it), or the gate that has already tripped. ``shares``: the children started together (one
    turn's delegations) split what is left evenly, so the tree never spends past its root's limits even
    when they all run at once; the price is that one sibling cannot use another's unspent share."""
    gate = check_gates(limits, usage, 0, elapsed_s, steps_used)
    if gate is not None:
        return gate
    steps = (limits.max_steps - steps_used) // shares
    tokens = (limits.max_tokens - usage.total_tokens) // shares
    if steps < 1:
        return Termination(ErrorCode.MAX_STEPS, f"{limits.max_steps - steps_used} steps left cannot go to "
                                                f"{shares} children")
    if tokens < 1:
        return Termination(ErrorCode.TOKEN_BUDGET, f"{limits.max_tokens - usage.total_tokens} tokens left "
                                                   f"cannot go to {shares} children")
    return Limits(max_steps=steps, max_tokens=tokens, max_cost_usd=(limits.max_cost_usd - usage.cost_usd) / shares,
                  deadline_s=limits.deadline_s - elapsed_s, max_repairs=limits.max_repairs)
