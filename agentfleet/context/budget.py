"""Budgets by category: what each part of a model call's context may take, per agent.

A call's window is split into an output reserve (the answer's room) and the prompt. The prompt is assembled from
six parts, each with its own budget, a share of the prompt unless the agent sets tokens:

* ``instructions``: the system prompt and the agent's worked examples;
* ``tools``: the definitions of the tools offered this turn;
* ``task``: the goal, and the constraints (the run's remaining budgets, which tools are down);
* ``observations``: the latest turn and what came back from it (its tool results, a repair note);
* ``summary``: what compaction made of older turns (one line each; the oldest and newest kept);
* ``recent``: older turns as they were (old tool results compacted first), in what is left.

The first four are the core and are never compacted. A core part over its own budget, or a core that does not fit
the prompt at all, ends the run ``CONTEXT_BUDGET_EXCEEDED`` naming the part: never silent truncation. Budgets are
caps, not reservations: what the core does not use is the summary's and the recent turns'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from agentfleet.errors import ConfigurationError


class Part(StrEnum):
    INSTRUCTIONS = "instructions"
    TOOLS = "tools"
    TASK = "task"
    OBSERVATIONS = "observations"
    SUMMARY = "summary"
    RECENT = "recent"


CORE = (Part.INSTRUCTIONS, Part.TOOLS, Part.TASK, Part.OBSERVATIONS)
WHAT = {
    Part.INSTRUCTIONS: "the instructions (system prompt and worked examples)",
    Part.TOOLS: "the tool definitions",
    Part.TASK: "the task (goal and constraints)",
    Part.OBSERVATIONS: "the latest turn and its observations",
    Part.SUMMARY: "the summary of older turns",
    Part.RECENT: "the recent turns",
}
# Shares of the prompt, by default. The core's add up to more than 1 on purpose: each is a cap on one part; the
# prompt as a whole is the real bound.
DEFAULT_SHARES: Mapping[Part, float] = {
    Part.INSTRUCTIONS: 0.30, Part.TOOLS: 0.30, Part.TASK: 0.25, Part.OBSERVATIONS: 0.75, Part.SUMMARY: 0.15,
    Part.RECENT: 1.0,
}
# The window of a model that declares none (a scripted or replayed one): a hosted model's usual.
UNKNOWN_WINDOW = 128_000
# The answer's room when neither the agent nor the model says: an eighth of the window, within these bounds.
DEFAULT_OUTPUT_RESERVE = (256, 4096)


@dataclass(frozen=True)
class ContextBudget:
    """How an agent's context is budgeted. Every field defaults from the model: ``window`` from the adapter's
    ``context_window``, ``output_reserve`` from its ``max_output_tokens`` (else an eighth of the window, 256 to
    4,096). ``parts`` sets a part's budget in tokens; ``shares`` as a share of the prompt."""

    window: int | None = None
    output_reserve: int | None = None
    parts: Mapping[Part | str, int] = field(default_factory=dict)
    shares: Mapping[Part | str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (*self.parts, *self.shares):
            if name not in Part.__members__.values():
                raise ConfigurationError(f"context budget: unknown part {name!r}; parts: "
                                         f"{', '.join(p.value for p in Part)}")
        if any(v <= 0 for v in self.parts.values()) or any(not 0 < v <= 1 for v in self.shares.values()):
            raise ConfigurationError("context budget: part budgets are positive, shares in (0, 1]")
        if self.window is not None and self.window < 64:
            raise ConfigurationError("context budget: a window under 64 tokens holds no prompt")

    def resolve(self, model_window: int | None, model_output: int | None) -> Budgets:
        """The tokens each part may take in one call. (What the run may spend in all is ``Limits.max_tokens``,
        checked by the loop's gates before and after each turn, not here.)"""
        window = self.window or model_window or UNKNOWN_WINDOW
        reserve = self.output_reserve or model_output or min(max(window // 8, DEFAULT_OUTPUT_RESERVE[0]),
                                                            DEFAULT_OUTPUT_RESERVE[1])
        reserve = min(reserve, window // 2)
        prompt = max(1, window - reserve)
        caps = {}
        for part in Part:
            if part in self.parts:
                caps[part] = min(prompt, int(self.parts[part]))
            else:
                caps[part] = max(1, int(prompt * self.shares.get(part, DEFAULT_SHARES[part])))
        return Budgets(window=window, reserve=reserve, prompt=prompt, caps=caps)


@dataclass(frozen=True)
class Budgets:
    """One call's budgets, in tokens."""

    window: int
    reserve: int
    prompt: int
    caps: Mapping[Part, int]

    def describe(self) -> str:
        return f"window {self.window}, output reserve {self.reserve}, prompt {self.prompt}"
