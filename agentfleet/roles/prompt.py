"""What the model is shown for one turn: the context assembled under the agent's budgets (context/), counted
exactly where the model's server offers a tokenizer, with the run's budgets in a short system line.

The assembly is pure and keyed by the checkpoint, so a redelivered plan step shows the model the same context;
what it took, by part, and what was compacted is recorded with the plan step (``Prompt.report``) for
``agentfleet trace``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agentfleet.agents.registry import Agent
from agentfleet.constants import READ_ARTIFACT_TOOL
from agentfleet.context.assemble import Assembled, Overflow, assemble
from agentfleet.context.budget import CORE
from agentfleet.context.builder import goal_message, system_prompt
from agentfleet.context.counting import Heuristic, whole
from agentfleet.fleet.gate import Offer
from agentfleet.loop.budgets import Limits, budget_line
from agentfleet.loop.transcript import History, Message
from agentfleet.store.records import RunRecord
from agentfleet.tools.artifacts import read_artifact

log = logging.getLogger(__name__)
# Assemblies after an exact count said the heuristic ran short (each rescales it by what was counted).
EXACT_RECOUNTS = 2


@dataclass(frozen=True)
class Prompt:
    messages: list[Message]
    tools: list[dict[str, Any]]
    report: dict[str, Any]


def prompt_for(agent: Agent, run: RunRecord, limits: Limits, iteration: int, seen: History,
               offer: Offer) -> Prompt | Overflow:
    """The turn's messages and tool definitions, or why the run's core context cannot fit."""
    model = agent.model
    budgets = agent.context.resolve(getattr(model, "context_window", None), getattr(model, "max_output_tokens", None))
    instructions = [Message(role="system", content=system_prompt(agent.instructions)), *agent.examples]
    constraints = [budget_line(limits, run.usage, iteration, run.steps_used), *([offer.notice] if offer.notice else [])]
    tools = agent.tool_specs(offer.tools)
    counter = Heuristic()

    def build(tools: list[dict[str, Any]], counter: Heuristic) -> Assembled | Overflow:
        return assemble(instructions=instructions, task=[goal_message(run.input)], constraints=constraints,
                        tools=tools, transcript=seen.messages, budgets=budgets, counter=counter,
                        transcript_chars=seen.chars)

    built = build(tools, counter)
    if isinstance(built, Assembled) and built.compacted and all(t["name"] != READ_ARTIFACT_TOOL for t in tools):
        tools = [*tools[:-1], read_artifact.spec(), tools[-1]]  # to read a compacted result back (final answer last)
        built = build(tools, counter)
    exact: int | None = None
    count_tokens = getattr(model, "count_tokens", None)
    for _ in range(EXACT_RECOUNTS + 1):
        if isinstance(built, Overflow) or not callable(count_tokens):
            break
        exact = count_tokens(built.messages, tools)
        if exact is None or exact <= budgets.prompt:
            break
        log.info("the heuristic counted %d tokens, the model's tokenizer %d: assembling again", whole(built.estimated),
                 exact, extra={"iteration": iteration})
        counter = counter.scaled(built.estimated, exact)
        built = build(tools, counter)
    if isinstance(built, Overflow):
        return built
    if exact is not None and exact > budgets.prompt:
        largest = max(CORE, key=lambda p: built.tokens[p.value])
        return Overflow(largest, exact, budgets.prompt,
                        f"the prompt counts {exact} tokens on the model's tokenizer, over its budget "
                        f"({budgets.describe()}) after compacting what may be")
    report = built.report(exact)
    if counter.scale != 1.0:
        report["scale"] = round(counter.scale, 3)
    return Prompt(built.messages, tools, report)
