"""What the model is shown for one turn: the context assembled under the agent's budgets (context/), counted
exactly where the model's server offers a tokenizer, with the run's budgets in a short system line.

The assembly is pure and keyed by the checkpoint, so a redelivered plan step shows the model the same context;
what it took, by part, and what was compacted is recorded with the plan step (``Prompt.report``) for
``agentfleet trace``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentfleet.agents.registry import Agent
from agentfleet.constants import READ_ARTIFACT_TOOL
from agentfleet.context.assemble import Assembled, Overflow, assemble
from agentfleet.context.budget import CORE, Part
from agentfleet.context.builder import goal_message, system_prompt
from agentfleet.context.compaction import latest_turn_at
from agentfleet.context.counting import Heuristic, whole
from agentfleet.context.older import indexed
from agentfleet.context.thread import thread_messages
from agentfleet.fleet.gate import Offer
from agentfleet.loop.budgets import Limits, budget_line
from agentfleet.loop.transcript import History, Message, Usage
from agentfleet.models.base import ModelRequest
from agentfleet.store.records import RunRecord
from agentfleet.tools.artifacts import read_artifact

log = logging.getLogger(__name__)
# Assemblies after an exact count said the heuristic ran short (each rescales it by what was counted).
EXACT_RECOUNTS = 2
# The part of the task's budget a thread's earlier exchanges may take (the goal and the constraints keep the rest).
THREAD_SHARE = 0.5


SUMMARY_INSTRUCTIONS = (
    "You keep the running summary of an agent's work on its task. Rewrite the summary so far to take in the new "
    "turns below. Keep every fact, number, name and result reference (result:<call id>) the task may still need; "
    "drop what it will not. Answer with the summary alone, in at most {tokens} tokens.")


@dataclass(frozen=True)
class Prompt:
    messages: list[Message]
    tools: Sequence[dict[str, Any]]
    report: dict[str, Any]
    spent: Usage = field(default_factory=Usage)  # what writing the summary cost (charged with the turn)


def recorded_summary(output: object) -> tuple[int, str] | None:
    """The model-written summary a plan step recorded (``report["summary"]``): (turns it covers, its text). What
    was stored is read strictly: anything else is no summary, and the lines stand in."""
    found = ((output if isinstance(output, dict) else {}).get("context") or {}).get("summary")
    if isinstance(found, dict) and isinstance(found.get("turns"), int) and found["turns"] > 0 \
            and isinstance(found.get("text"), str) and found["text"].strip():
        return found["turns"], found["text"]
    return None


def prompt_for(agent: Agent, run: RunRecord, limits: Limits, iteration: int, seen: History,
               offer: Offer, summary: tuple[int, str] | None = None,
               thread: Sequence[dict[str, Any]] = ()) -> Prompt | Overflow:
    """The turn's messages and tool definitions, or why the run's core context cannot fit. ``summary``: the one
    the last plan step recorded, which an agent with a ``summary_model`` extends when more turns fold into it.
    ``thread``: what the thread's earlier runs left (``Store.thread_before``), shown before the goal within
    ``THREAD_SHARE`` of the task's budget."""
    model = agent.model
    if getattr(model, "whole_transcript", False):  # a graph: the record is its position, read whole, never compacted
        return Prompt([Message(role="system", content=system_prompt(agent.instructions)), *seen.messages],
                      agent.tool_specs(offer.tools), {})
    budgets = agent.context.resolve(getattr(model, "context_window", None), getattr(model, "max_output_tokens", None))
    instructions = [Message(role="system", content=system_prompt(agent.instructions)), *agent.examples]
    constraints = [budget_line(limits, run.usage, iteration, run.steps_used), *([offer.notice] if offer.notice else [])]
    tools = agent.tool_specs(offer.tools)
    counter = Heuristic()
    goal = goal_message(run.input)

    def build(tools: Sequence[dict[str, Any]], counter: Heuristic) -> Assembled | Overflow:
        cap = budgets.caps[Part.TASK]  # the goal and the constraints first: the thread has what they leave
        room = cap - counter.messages([goal]) - counter.chars(sum(map(len, constraints)) + 2)
        earlier = thread_messages(thread, min(cap * THREAD_SHARE, room), counter) if thread else []
        return assemble(instructions=instructions, task=[*earlier, goal], constraints=constraints,
                        tools=tools, transcript=seen.messages, budgets=budgets, counter=counter,
                        transcript_chars=seen.chars, summarized=summary, derived=seen.derived)

    built = build(tools, counter)
    if isinstance(built, Assembled) and built.compacted and all(t["name"] != READ_ARTIFACT_TOOL for t in tools):
        tools = [*tools[:-1], read_artifact.spec(), tools[-1]]  # to read a compacted result back (final answer last)
        built = build(tools, counter)
    spent = Usage()
    folded = built.compacted.get("turns", 0) if isinstance(built, Assembled) else 0
    if agent.summary_model is not None and folded > (summary[0] if summary else 0):
        written, spent = _summarize(agent, run, iteration, seen, summary, folded, budgets.caps[Part.SUMMARY])
        if written is not None:
            summary = (folded, written)
            built = build(tools, counter)
    count_tokens = getattr(model, "count_tokens", None)
    exact = count_tokens(built.messages, tools) if callable(count_tokens) and isinstance(built, Assembled) else None
    for _ in range(EXACT_RECOUNTS):  # every re-assembly is counted again before it is judged
        if exact is None or exact <= budgets.prompt or not isinstance(built, Assembled):
            break
        log.info("the heuristic counted %d tokens, the model's tokenizer %d: assembling again", whole(built.estimated),
                 exact, extra={"iteration": iteration})
        counter = counter.scaled(built.estimated, exact)
        built = build(tools, counter)
        exact = count_tokens(built.messages, tools) if isinstance(built, Assembled) else None  # type: ignore[misc]
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
    if summary is not None and built.compacted.get("summarized"):
        report["summary"] = {"turns": summary[0], "text": summary[1]}  # the next turn goes on from it
    return Prompt(built.messages, tools, report, spent)


def _summarize(agent: Agent, run: RunRecord, iteration: int, seen: History, summary: tuple[int, str] | None,
               folded: int, budget: int) -> tuple[str | None, Usage]:
    """The summary so far, extended by the turns folded since, written by the agent's summary model; None (and the
    lines stand in) when the call fails or says nothing. Not retried: the lines are a fallback that always fits."""
    model = agent.summary_model
    assert model is not None
    older = indexed(seen.messages, latest_turn_at(seen.messages), seen.derived)  # what the assembly just indexed
    start = summary[0] if summary else 0
    new = "\n".join(older.lines(start, folded))
    messages = [Message(role="system", content=SUMMARY_INSTRUCTIONS.format(tokens=max(1, budget // 2))),
                Message(role="user", content=f"Task: {json.dumps(run.input, sort_keys=True)[:2000]}\n\n"
                                             f"Summary so far:\n{summary[1] if summary else '(none)'}\n\n"
                                             f"New turns:\n{new}")]
    request = ModelRequest(run_id=run.run_id, agent=agent.name, iteration=iteration, goal=run.input,
                           messages=messages, tools=[])
    try:
        turn = model.complete(request)
    except Exception as exc:  # any failure of the summary's model: the extractive lines stand in
        log.warning("the summary model failed; older turns stay as lines: %s", exc, extra={"iteration": iteration})
        return None, Usage()
    text = (turn.text or "").strip()
    return (text or None), turn.usage
