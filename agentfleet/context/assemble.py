"""Assembling one model call's context from its parts under their budgets (context/budget.py), compacting older
turns in layers (context/compaction.py) until the prompt fits.

Pure and deterministic: the same checkpoint (transcript, goal, offer, budgets, counter) gives the same messages,
so a redelivered plan step or a strict replay sees the context the model saw. The result says what each part
took and what was compacted; the planner stores that with the plan step, and ``agentfleet trace`` shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentfleet.context.budget import CORE, WHAT, Budgets, Part
from agentfleet.context.compaction import Turn, compact_result, escaped, latest_turn_at, lined, summary_text, turns_of
from agentfleet.context.counting import Heuristic, whole
from agentfleet.loop.transcript import Message, message_chars


@dataclass(frozen=True)
class Assembled:
    """The messages of one call, and what went into them."""

    messages: list[Message]
    tokens: dict[str, int]  # by part, as counted by the heuristic (scaled)
    budgets: Budgets
    compacted: dict[str, int] = field(default_factory=dict)  # results, turns (as lines), omitted (lines dropped)
    estimated: float = 0.0  # the whole prompt, unrounded (what an exact count is compared with)

    def report(self, exact: int | None = None) -> dict[str, Any]:
        """What the plan step records: tokens by part, the budgets, what was compacted, an exact count if any."""
        out: dict[str, Any] = {"tokens": self.tokens, "total": whole(self.estimated), "prompt": self.budgets.prompt,
                               "window": self.budgets.window, "reserve": self.budgets.reserve}
        if self.compacted:
            out["compacted"] = self.compacted
        if exact is not None:
            out["exact"] = exact
        return out


@dataclass(frozen=True)
class Overflow:
    """The never-compacted core does not fit: the run ends ``CONTEXT_BUDGET_EXCEEDED`` with this message."""

    part: Part
    tokens: int
    budget: int
    message: str


def assemble(*, instructions: Sequence[Message], task: Sequence[Message], constraints: Sequence[str],
             tools: Sequence[dict[str, Any]], transcript: Sequence[Message], budgets: Budgets,
             counter: Heuristic | None = None, transcript_chars: int | None = None,
             summarized: tuple[int, str] | None = None) -> Assembled | Overflow:
    """The prompt: ``instructions`` (system prompt, examples), ``task`` (the goal), the compacted older turns,
    the latest turn and its results. ``constraints`` (short lines about this turn: budgets left, tools down)
    count as the task's and end the system prompt: a system message late in the conversation derails small
    models (measured: Qwen2.5-Coder-1.5B answered in prose), and Messages APIs take one system prompt anyway.
    ``transcript_chars``: the transcript's ``message_chars`` summed, when the caller keeps it (``History``): a
    prompt that fits then costs nothing per message of the transcript.
    ``summarized``: (n, text), a model's summary of the first ``n`` older turns, used in place of their lines when
    at least that many are folded and it fits the summary's budget (else the lines, as without one)."""
    count = counter or Heuristic()
    cut = latest_turn_at(transcript)  # found from the end: a prompt that fits costs nothing per older message
    latest = list(transcript[cut:])
    told, moved = "\n".join(constraints), 0.0
    if told and instructions and instructions[0].role == "system":
        first = instructions[0]
        system = first.model_copy(update={"content": f"{first.content}\n\n{told}"})
        moved = count.chars(message_chars(system) - message_chars(first), 0)  # the task's, in the system prompt
        instructions = [system, *instructions[1:]]
    core = {Part.INSTRUCTIONS: count.messages(instructions) - moved, Part.TOOLS: count.tools(tools),
            Part.TASK: count.messages(task) + moved, Part.OBSERVATIONS: count.messages(latest)}
    for part in CORE:
        if whole(core[part]) > budgets.caps[part]:
            return _overflow(part, core[part], budgets.caps[part], budgets, "its budget")
    room = budgets.prompt - sum(core.values())
    if room < 0:
        part = max(CORE, key=lambda p: core[p] / budgets.caps[p])
        return _overflow(part, core[part], budgets.caps[part], budgets,
                         f"what the prompt has for it beside the rest of the core ({whole(core[part] + room)})")
    room = min(room, budgets.caps[Part.RECENT])
    older_count = cut
    if transcript_chars is not None:
        older_tokens = count.chars(transcript_chars - sum(map(message_chars, latest)), older_count)
    else:
        older_tokens = count.messages(transcript[:older_count])
    head = [*instructions, *task]
    if older_tokens <= room:
        tokens = {**{p.value: whole(t) for p, t in core.items()}, Part.SUMMARY.value: 0,
                  Part.RECENT.value: whole(older_tokens)}
        return Assembled([*head, *transcript], tokens, budgets,
                         estimated=sum(core.values()) + older_tokens)
    return _compacted(head, latest, turns_of(transcript[:cut]), core, room, budgets, count, summarized)


def _compacted(head: list[Message], latest: list[Message], older: list[Turn], core: dict[Part, float], room: float,
               budgets: Budgets, count: Heuristic, summarized: tuple[int, str] | None) -> Assembled | Overflow:
    """Layers 1-3 in order, each only as far as needed, oldest turns first."""
    kept = [list(t.messages) for t in older]
    sizes = [count.messages(ms) for ms in kept]
    used = sum(sizes)
    results = 0
    for i, messages in enumerate(kept):  # layer 1: old tool results -> reference and head
        if used <= room:
            break
        changed = False
        for j, message in enumerate(messages):
            if message.role == "tool":
                smaller = compact_result(message)
                if smaller is not message:
                    messages[j] = smaller
                    results += 1
                    changed = True
        used -= sizes[i]  # taken out and put back even when unchanged: the same float operations as always
        if changed:  # a turn left as it was keeps its size (sizing is what cost, per older turn and plan)
            sizes[i] = count.messages(messages)
        used += sizes[i]
    # Layer 2: the oldest turns become one line each, as long as the recent turns left and the summary (never
    # more than its budget: layer 3 squeezes it) do not fit.
    cap = budgets.caps[Part.SUMMARY]
    costs: list[float] = []
    lines: list[str] = []
    title = count.message(Message(role="system", content=summary_text([], 0, 0)))
    start, total = 0, 0.0  # total: sum(costs), kept as ``sum`` adds (left to right), not summed again each turn
    while start < len(kept) and used + (min(title + total, cap) if costs else 0.0) > room:
        line, size = lined(older[start])
        lines.append(line)
        costs.append(count.chars(size, 0))
        total += costs[-1]
        used -= sizes[start]
        start += 1
    summary: Message | None = None
    summary_tokens, omitted = 0.0, 0
    if start:
        allowed = min(cap, room - used)
        squeezed, by_model = None, 0
        if summarized is not None and 0 < summarized[0] <= start:  # a model's summary of the first turns, then lines
            by_model, text = summarized
            squeezed = _summary_within(lines[by_model:], costs[by_model:], allowed, count, text)
        if squeezed is None:
            by_model = 0
            squeezed = _summary_within(lines, costs, allowed, count)
        if squeezed is None:
            largest = max(CORE, key=lambda p: core[p])
            return _overflow(largest, core[largest], budgets.caps[largest], budgets,
                             f"what leaves room for a summary of the older turns ({whole(room)} left)")
        summary, summary_tokens, omitted = squeezed
    recent = [m for ms in kept[start:] for m in ms]
    messages = [*head, *([summary] if summary else []), *recent, *latest]
    tokens = {**{p.value: whole(t) for p, t in core.items()}, Part.SUMMARY.value: whole(summary_tokens),
              Part.RECENT.value: whole(used)}
    compacted = {k: v for k, v in (("results", results), ("turns", start), ("omitted", omitted),
                                   ("summarized", by_model if start else 0)) if v}
    return Assembled(messages, tokens, budgets, compacted, sum(core.values()) + used + summary_tokens)


def _summary_within(lines: list[str], costs: list[float], allowed: float, count: Heuristic,
                    head: str | None = None) -> tuple[Message, float, int] | None:
    """The summary message of ``lines`` (``costs``: each line's tokens) that fits ``allowed`` tokens, keeping
    the oldest third and the newest lines it can, and how many it left out; None if not even its title fits."""
    title = count.message(Message(role="system", content=summary_text([], 0, 0, head)))
    marker = count.chars(escaped(summary_text(["x", "y", "z"], 1, 1)) - escaped(summary_text([], 0, 0)), 0)

    def estimate(keep: int) -> float:
        return title + marker + sum(costs[: keep // 3]) + sum(costs[len(lines) - (keep - keep // 3):])

    # The most lines the estimate lets in (none: 0), checked on the real message below. Each line fewer drops one
    # cost, from the front or the back, and a float sum of costs (none negative) never grows when one is dropped:
    # the estimate is monotone in ``keep``, so halving finds the ``keep`` stepping down one at a time found, in
    # log(n) estimates instead of n (each O(n): stepping down was quadratic in the older turns).
    keep, over = 0, len(lines)
    if estimate(over) <= allowed:
        keep = over
    while over - keep > 1:
        mid = (keep + over) // 2
        if estimate(mid) <= allowed:
            keep = mid
        else:
            over = mid
    while keep >= 0:
        first = keep // 3
        message = Message(role="system", content=summary_text(lines, first, keep - first, head))
        size = count.message(message)
        if size <= allowed:
            return message, size, len(lines) - keep
        keep -= 1
    return None


def _overflow(part: Part, tokens: float, cap: int, budgets: Budgets, over_what: str) -> Overflow:
    return Overflow(part, whole(tokens), cap,
                    f"{WHAT[part]} take(s) about {whole(tokens)} tokens, over {over_what} ({cap}; "
                    f"{budgets.describe()}): shorten it or give the agent a larger context budget")
