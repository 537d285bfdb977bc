"""What one plan's prompt assembly costs as a run grows past its model's window.

A planner keeps its run's ``History`` and grows it by the turn that came back; each plan assembles the prompt from
it. This does the same in one process, without a fleet: a run of ``n`` varied turns (calls with small and large
results, words now and then), assembled once, then grown a turn at a time and assembled again, ``PLANS`` times;
the figure is the median thread CPU of those plans. ``python -m benchmarks.assembly_growth`` prints a table by
window and turns; run it from another tree's root (``PYTHONPATH``) to compare with that tree.
"""

from __future__ import annotations

import inspect
import json
import random
import statistics
import time
from typing import Any

from agentfleet.context import Assembled, ContextBudget, assemble
from agentfleet.context.builder import goal_message, system_prompt
from agentfleet.loop import Message, ToolCall
from agentfleet.loop.transcript import History

PLANS = 15
TOOLS = [{"name": "t", "description": "a tool", "parameters": {"type": "object"}}]
CASES = ((8_192, (200, 800, 1_600, 3_200)), (128_000, (1_500, 3_000, 6_000)))


def turns(n: int, seed: int = 1) -> list[list[Message]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        calls = [ToolCall(id=f"i{i}-c{k}", name=rng.choice(["t", "read"]), arguments={"i": i, "q": "x" * rng.randint(
            0, 120)}) for k in range(rng.choice([0, 1, 1, 1, 2]))]
        said = rng.choice([None, None, f"thinking about {i} " * rng.randint(1, 12)])
        turn = [Message(role="assistant", content=said, tool_calls=calls)]
        turn += [Message(role="tool", tool_call_id=c.id, content=json.dumps({"fact": i, "data": "y" * rng.choice(
            [5, 100, 239, 241, 600, 4000])})) for c in calls]
        out.append(turn)
    return out


def plan_ms(window: int, n: int) -> tuple[float, dict[str, int]]:
    """The median CPU of a plan at turn ``n``, and what the last one compacted."""
    budgets = ContextBudget(window=window).resolve(None, None)
    body = turns(n + PLANS)
    indexed = "derived" in inspect.signature(assemble).parameters

    def plan(history: History) -> Assembled:
        extra: dict[str, Any] = {"derived": history.derived} if indexed else {}
        built = assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                         task=[goal_message({"path": "."})], constraints=["2 steps left"], tools=TOOLS,
                         transcript=history.messages, budgets=budgets, transcript_chars=history.chars, **extra)
        assert isinstance(built, Assembled)
        return built

    history = History.of(m for t in body[:n] for m in t)
    plan(history)
    times = []
    for t in body[n:]:
        history = history.plus(t)
        start = time.thread_time()
        built = plan(history)
        times.append((time.thread_time() - start) * 1000)
    return statistics.median(times), built.compacted


def main() -> None:
    print(f"| window | turns | CPU ms a plan (median of {PLANS}) | compacted |")
    print("|---|---|---|---|")
    for window, sizes in CASES:
        for n in sizes:
            ms, compacted = plan_ms(window, n)
            print(f"| {window} | {n} | {ms:.3f} | {compacted} |", flush=True)


if __name__ == "__main__":
    main()
