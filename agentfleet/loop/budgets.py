"""Limits and the termination gates that end a loop for exactly one named reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from agentfleet.errors import ErrorCode
from agentfleet.loop.transcript import Usage

# Loop defaults (an agent's or goal's limits override them).
DEFAULT_MAX_STEPS = 20
# Turns a run may spend telling the model its answer could not be used (bad tool arguments, an undeclared
# tool, an empty, cut-off or off-schema answer) before it fails with that answer's code.
DEFAULT_MAX_REPAIRS = 3
# Tool calls one model turn may make: a turn of 1,000 calls would be 1,000 side effects decided as one step.
DEFAULT_MAX_CALLS_PER_TURN = 32
DEFAULT_MAX_TOKENS = 200_000
DEFAULT_MAX_COST_USD = 5.0
DEFAULT_DEADLINE_S = 600.0


# The bounds of every limit, shared by an agent's Limits and a goal's requested limits, so the
# inbox refuses exactly what the planner would (a zero budget is refused, not read as "no limit").
Steps = Annotated[int, Field(ge=1, le=10_000)]
Tokens = Annotated[int, Field(ge=1, le=10**12)]
Repairs = Annotated[int, Field(ge=0, le=100)]
CallsPerTurn = Annotated[int, Field(ge=1, le=1000)]
CostUsd = Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=30 * 24 * 3600, allow_inf_nan=False)]


class Limits(BaseModel):
    """What one run may spend: model turns (``max_steps``), tokens in and out (``max_tokens``), US dollars
    (``max_cost_usd``) and wall time from its start (``deadline_s``). Checked before each model call; a run
    over one ends ``FAILED`` with ``MAX_STEPS``, ``TOKEN_BUDGET``, ``COST_BUDGET`` or ``DEADLINE``.
    ``max_repairs``: unusable answers the model is told about and asked again, run-wide;
    ``max_calls_per_turn``: tool calls one turn may make (more is an unusable turn, ``TOO_MANY_CALLS``). An
    agent sets them; a goal may ask for tighter ones (``"limits": {...}``), never looser."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: Steps = DEFAULT_MAX_STEPS
    max_tokens: Tokens = DEFAULT_MAX_TOKENS
    max_cost_usd: CostUsd = DEFAULT_MAX_COST_USD
    deadline_s: Seconds = DEFAULT_DEADLINE_S
    # Answers the model may be asked to give again (each costs a step too), run-wide.
    max_repairs: Repairs = DEFAULT_MAX_REPAIRS
    max_calls_per_turn: CallsPerTurn = DEFAULT_MAX_CALLS_PER_TURN

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
            max_calls_per_turn=min(self.max_calls_per_turn, other.max_calls_per_turn),
        )


@dataclass(frozen=True)
class Termination:
    """Why a loop must end now."""

    code: ErrorCode
    message: str


def check_gates(limits: Limits, usage: Usage, iteration: int, elapsed_s: float, steps_used: int = 0
                ) -> Termination | None:
    """Gates checked before each model call; the first that trips names the ending. ``steps_used`` and
    ``usage`` count the turns of the run's descendants too, as they are recorded (one budget per tree)."""
    if max(iteration, steps_used) >= limits.max_steps:
        return Termination(ErrorCode.MAX_STEPS, f"reached max_steps={limits.max_steps} without a final answer")
    spent = _spent(limits, usage, at_limit=True)
    if spent is not None:
        return spent
    if elapsed_s >= limits.deadline_s:
        return Termination(ErrorCode.DEADLINE, f"ran {elapsed_s:.1f}s of deadline_s={limits.deadline_s}")
    return None


def _spent(limits: Limits, usage: Usage, *, at_limit: bool) -> Termination | None:
    """Tokens or dollars spent: reached (before a model call: nothing is left) or passed (after one)."""
    tokens, cost = usage.total_tokens, usage.cost_usd
    if tokens > limits.max_tokens or (at_limit and tokens == limits.max_tokens):
        return Termination(ErrorCode.TOKEN_BUDGET, f"used {tokens} tokens of max_tokens={limits.max_tokens}")
    if cost > limits.max_cost_usd or (at_limit and cost == limits.max_cost_usd):
        return Termination(ErrorCode.COST_BUDGET, f"spent ${cost:.4f} of max_cost_usd={limits.max_cost_usd}")
    return None


def check_turn(limits: Limits, usage_with_turn: Usage) -> Termination | None:
    """Checked after a model's turn and before any of its calls is dispatched: a turn that took the run past
    its token or dollar budget runs nothing (its calls would be paid for with money the run does not have)."""
    gate = _spent(limits, usage_with_turn, at_limit=False)
    return Termination(gate.code, f"{gate.message} with this turn; none of its calls was run") if gate else None


def charged(usage: Usage, written_tokens: int) -> Usage:
    """What a turn counts for against the budget: the model's own count of its output, or the size of what it
    wrote (``written_tokens``, estimated from its text) where that is more, so a model or server that
    under-reports cannot buy a 5 MB turn for the price of a short one."""
    if written_tokens <= usage.output_tokens:
        return usage
    return usage.model_copy(update={"output_tokens": written_tokens})


@dataclass(frozen=True)
class TreeLevel:
    """One ancestor of a delegated run, as its gate sees it: its limits, and what its whole subtree has spent
    so far (each model turn of a descendant is added to every ancestor as it is recorded)."""

    label: str  # how a person is told which level ran out: "run <id> (<agent>)"
    limits: Limits
    usage: Usage
    steps_used: int
    elapsed_s: float
    ended: str | None = None  # the state it ended in, if it has: nothing beneath it may start or take a turn
    reserved: Reservation | None = None  # what turns in flight beneath it hold: counted as spent


def check_tree(levels: list[TreeLevel]) -> Termination | None:
    """The tree's gates, checked before a delegated run's model call: the first ancestor (the root first)
    whose subtree has spent its limits stops the run, with the same code a single run gets. Siblings draw
    on one budget, so the one that needs more may use what another left."""
    for level in levels:
        if level.ended is not None:
            return Termination(ErrorCode.CANCELLED, f"its ancestor {level.label} has ended ({level.ended}); "
                                                    "nothing beneath it runs on")
        held = level.reserved or NOTHING_RESERVED
        usage = level.usage + Usage(input_tokens=held.tokens, cost_usd=held.cost_usd)
        gate = check_gates(level.limits, usage, 0, level.elapsed_s, level.steps_used + held.steps)
        if gate is not None:
            return Termination(gate.code, f"the tree's budget, at {level.label}: {gate.message}"
                                          + (" (with the turns in flight beneath it)" if level.reserved else ""))
    return None


@dataclass(frozen=True)
class Reservation:
    """A delegated run's turn in flight, held in every ancestor from before its model call until it records what
    it spent: siblings planning at the same time see each other's, so a tree cannot overshoot its budget by
    one turn per planner thread, only by one turn's estimate error."""

    tokens: int
    cost_usd: float = 0.0
    steps: int = 1

    def as_dict(self) -> dict[str, float]:
        return {"tokens": self.tokens, "cost_usd": self.cost_usd, "steps": self.steps}

    @classmethod
    def from_dict(cls, data: object) -> Reservation | None:
        """A reservation as a plan step recorded it (stored rows are input: anything else is none)."""
        if not isinstance(data, dict):
            return None
        tokens, cost, steps = data.get("tokens"), data.get("cost_usd"), data.get("steps")
        if not (isinstance(tokens, int) and isinstance(cost, int | float) and isinstance(steps, int)):
            return None
        return cls(tokens, float(cost), steps)


NOTHING_RESERVED = Reservation(0, 0.0, 0)


def remaining(limits: Limits, usage: Usage, steps_used: int, elapsed_s: float) -> Limits | Termination:
    """What a child started now may spend: what is left of ``limits`` (its own agent's limits can only
    tighten it), or the gate that has already tripped."""
    gate = check_gates(limits, usage, 0, elapsed_s, steps_used)
    if gate is not None:
        return gate
    return Limits(max_steps=limits.max_steps - steps_used, max_tokens=limits.max_tokens - usage.total_tokens,
                  max_cost_usd=limits.max_cost_usd - usage.cost_usd, deadline_s=limits.deadline_s - elapsed_s,
                  max_repairs=limits.max_repairs, max_calls_per_turn=limits.max_calls_per_turn)


def budget_line(limits: Limits, usage: Usage, iteration: int, steps_used: int = 0) -> str:
    """What the model is told of its run's budgets before a turn, so it can plan to finish: steps, tokens and
    dollars left (from the checkpoint only, so a replay shows the same line; the deadline is enforced, not
    shown, as the time left differs on every try). On the last step it is told to answer now."""
    steps_left = max(0, limits.max_steps - max(iteration, steps_used))
    tokens_left = max(0, limits.max_tokens - usage.total_tokens)
    cost_left = max(0.0, limits.max_cost_usd - usage.cost_usd)
    line = f"Budget left: {steps_left} step(s) including this one, {tokens_left} tokens, ${cost_left:.4f}."
    if steps_left <= 1:
        line += " This is the last step: give the final answer now."
    return line
