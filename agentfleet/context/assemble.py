"""Assembling one model call's context from its parts under their budgets (context/budget.py), compacting older
turns in layers (context/compaction.py) until the prompt fits.

Pure and deterministic: the same checkpoint (transcript, goal, offer, budgets, counter) gives the same messages,
so a redelivered plan step or a strict replay sees the context the model saw. The result says what each part
took and what was compacted; the planner stores that with the plan step, and ``agentfleet trace`` shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentfleet.context.budget import CORE, WHAT, Budgets, Part
from agentfleet.context.compaction import escaped, latest_turn_at, summary_text
from agentfleet.context.counting import Heuristic, whole
from agentfleet.context.older import Index, indexed
from agentfleet.loop.transcript import Derived, Message, message_chars


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
             summarized: tuple[int, str] | None = None, derived: Derived | None = None) -> Assembled | Overflow:
    """The prompt: ``instructions`` (system prompt, examples), ``task`` (the goal), the compacted older turns,
    the latest turn and its results. ``constraints`` (short lines about this turn: budgets left, tools down)
    count as the task's and end the system prompt: a system message late in the conversation derails small
    models (measured: Qwen2.5-Coder-1.5B answered in prose), and Messages APIs take one system prompt anyway.
    ``transcript_chars``: the transcript's ``message_chars`` summed, when the caller keeps it (``History``): a
    prompt that fits then costs nothing per message of the transcript.
    ``summarized``: (n, text), a model's summary of the first ``n`` older turns, used in place of their lines when
    at least that many are folded and it fits the summary's budget (else the lines, as without one).
    ``derived``: the slot of the transcript's ``History`` where its older turns' index (context/older.py) is kept
    as it grows: a prompt past the window then costs what the turns older since the last plan cost."""
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
    older = indexed(transcript, cut, derived)
    return _compacted(head, latest, transcript, older, core, room, budgets, count, summarized)


def _compacted(head: list[Message], latest: list[Message], transcript: Sequence[Message], older: Index,
               core: dict[Part, float], room: float, budgets: Budgets, count: Heuristic,
               summarized: tuple[int, str] | None) -> Assembled | Overflow:
    """Layers 1-3 in order, each only as far as needed, oldest turns first."""
    cap = budgets.caps[Part.SUMMARY]
    title = count.message(Message(role="system", content=summary_text([], 0, 0)))
    folds = _halved if older.exact_for(count) else _walked
    done, start, used, span = folds(older, count, room, title, cap)
    summary: Message | None = None
    summary_tokens, omitted, by_model = 0.0, 0, 0
    if start:
        allowed = min(cap, room - used)
        squeezed = None
        if summarized is not None and 0 < summarized[0] <= start:  # a model's summary of the first turns, then lines
            by_model, text = summarized
            squeezed = _summary_within(older.lines(by_model, start),
                                       lambda a, b: span(by_model + a, by_model + b), allowed, count, text)
        if squeezed is None:
            by_model = 0
            squeezed = _summary_within(older.lines(0, start), span, allowed, count)
        if squeezed is None:
            largest = max(CORE, key=lambda p: core[p])
            return _overflow(largest, core[largest], budgets.caps[largest], budgets,
                             f"what leaves room for a summary of the older turns ({whole(room)} left)")
        summary, summary_tokens, omitted = squeezed
    recent = older.messages(transcript, start, done)
    messages = [*head, *([summary] if summary else []), *recent, *latest]
    tokens = {**{p.value: whole(t) for p, t in core.items()}, Part.SUMMARY.value: whole(summary_tokens),
              Part.RECENT.value: whole(used)}
    compacted = {k: v for k, v in (("results", older.columns.results[done]), ("turns", start), ("omitted", omitted),
                                   ("summarized", by_model)) if v}
    return Assembled(messages, tokens, budgets, compacted, sum(core.values()) + used + summary_tokens)


Span = Callable[[int, int], float]  # the tokens of the lines of folded turns a..b-1, as ``sum`` adds their costs


def _walked(older: Index, count: Heuristic, room: float, title: float,
            cap: int) -> tuple[int, int, float, Span]:
    """Where layers 1 and 2 stop (turns with results compacted, turns folded), the older turns' tokens left, and the
    lines' tokens: found by walking the turns one by one, in the float operations assembly always made (whatever
    the heuristic's scale, the same prompt as every earlier version of the fleet)."""
    c, k = older.columns, older.turns
    sizes = [count.chars(c.chars[t + 1] - c.chars[t], c.messages[t + 1] - c.messages[t]) for t in range(k)]
    used = sum(sizes)
    done = k
    for i in range(k):  # layer 1: old tool results -> reference and head
        if used <= room:
            done = i
            break
        used -= sizes[i]  # taken out and put back even when unchanged: the same float operations as always
        if c.results[i + 1] > c.results[i]:
            sizes[i] = count.chars(c.compacted[i + 1] - c.compacted[i], c.messages[i + 1] - c.messages[i])
        used += sizes[i]
    # Layer 2: the oldest turns become one line each, as long as the recent turns left and the summary (never
    # more than its budget: layer 3 squeezes it) do not fit.
    costs: list[float] = []
    start, total = 0, 0.0  # total: sum(costs), kept as ``sum`` adds (left to right), not summed again each turn
    while start < k and used + (min(title + total, cap) if costs else 0.0) > room:
        costs.append(count.chars(c.lines[start + 1] - c.lines[start], 0))
        total += costs[-1]
        used -= sizes[start]
        start += 1
    return done, start, used, lambda a, b: sum(costs[a:b])


def _halved(older: Index, count: Heuristic, room: float, title: float,
            cap: int) -> tuple[int, int, float, Span]:
    """What ``_walked`` finds, found by halving over the index's running sums: log(turns) steps, not turns. Exact
    where ``Index.exact_for`` says so: each sum is then the float the walk's additions made, and folding one more turn
    never makes the prompt larger, so the first fold that fits is found by bisection."""
    k, lines = older.turns, older.columns.lines

    def used(done: int, start: int) -> float:
        return count.chars(*older.size(start, k, done))

    def span(a: int, b: int) -> float:
        return count.chars(lines[b] - lines[a], 0)

    done = _first(0, k, lambda i: used(i, 0) <= room)  # layer 1
    start = 0 if k == 0 or used(done, 0) <= room else (  # layer 2: the title comes with the first fold
        _first(1, k, lambda s: used(done, s) + min(title + span(0, s), cap) <= room))
    return done, start, used(done, start), span


def _first(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The least ``i`` in ``lo..hi-1`` that ``fits`` (which, once true, stays true as ``i`` grows); else ``hi``."""
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _summary_within(lines: Sequence[str], span: Span, allowed: float, count: Heuristic,
                    head: str | None = None) -> tuple[Message, float, int] | None:
    """The summary message of ``lines`` (``span``: their tokens, by range) that fits ``allowed`` tokens, keeping
    the oldest third and the newest lines it can, and how many it left out; None if not even its title fits."""
    title = count.message(Message(role="system", content=summary_text([], 0, 0, head)))
    marker = count.chars(escaped(summary_text(["x", "y", "z"], 1, 1)) - escaped(summary_text([], 0, 0)), 0)

    def estimate(keep: int) -> float:
        return title + marker + span(0, keep // 3) + span(len(lines) - (keep - keep // 3), len(lines))

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
