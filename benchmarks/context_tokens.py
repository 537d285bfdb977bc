"""The context heuristic against an exact tokenizer, and what assembling a context costs
(``python -m benchmarks.context_tokens``; figures in benchmarks/README.md, "A context that always fits").

1. Counting: prompts the fleet builds (the bundled agents' first turns, word_stats after its tool results, the
   long reader of tests/fixtures/context_agents.py compacted at several lengths, and random text and JSON tool
   results) are counted by ``context.counting.Heuristic`` and by llama-server's tokenizer for Qwen2.5-Coder-1.5B
   (the chat template applied by the server, then ``/tokenize``). Needs ``make demo-local-model`` once (the
   server build and the model are cached); ``--no-server`` skips this part.
2. Assembly: ``context.assemble`` for histories of 10 to 1,000 messages, over budget, timed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import time
from typing import Any

from agentfleet.context import ContextBudget, Heuristic, assemble
from agentfleet.context.builder import goal_message, system_prompt
from agentfleet.loop.transcript import Message, ToolCall
from agentfleet.models.openai_chat import LlamaServerTokens, to_openai


def _history(turns: int, result_chars: int, seed: int, json_results: bool) -> list[Message]:
    rnd = random.Random(seed)
    out: list[Message] = []
    for n in range(turns):
        out.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{n}", name="page", arguments={"n": n})]))
        words = " ".join("".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 10)))
                         for _ in range(result_chars // 6))
        output: Any = {"rows": [{"id": i, "name": words[i * 40:(i + 1) * 40]} for i in range(result_chars // 60)]} \
            if json_results else {"text": words[:result_chars]}
        out.append(Message(role="tool", tool_call_id=f"c{n}", content=json.dumps({"ok": True, "output": output})))
    return out


def prompts() -> list[tuple[str, list[Message], list[dict[str, Any]]]]:
    """(label, messages, tool specs) of prompts the planner builds."""
    from agentfleet.agents.registry import load_agents, registry

    load_agents(["agentfleet.examples.word_stats", "agentfleet.examples.support", "agentfleet.examples.repo_report"])
    found = []
    for name in ("word_stats", "triage", "resolver", "kb_search", "repo_report"):
        agent = registry.get(name)
        assert agent is not None
        head = [Message(role="system", content=system_prompt(agent.instructions) + "\n\nBudget left: 6 step(s)."),
                *agent.examples]
        found.append((f"{name}, first turn", [*head, goal_message({"text": "The quick brown fox", "query": "x"})],
                      agent.tool_specs()))
    tools = [{"name": "page", "description": "Read a page.", "parameters": {"type": "object",
                                                                           "properties": {"n": {"type": "integer"}}}}]
    for turns, chars, as_json in ((3, 400, False), (10, 2000, False), (10, 2000, True), (40, 4400, False),
                                  (100, 4400, False), (100, 3000, True)):
        body = _history(turns, chars, turns, as_json)
        for window in (4096, 16384):
            built = assemble(instructions=[Message(role="system", content=system_prompt("Read every page."))],
                             task=[goal_message({"doc": "d"})], constraints=["Budget left: 9 step(s)."],
                             tools=tools, transcript=body, budgets=ContextBudget(window=window).resolve(None, None))
            assert not hasattr(built, "part"), built
            found.append((f"{turns} turns of {chars}-char {'JSON' if as_json else 'text'} results, window {window}",
                          built.messages, tools))  # type: ignore[union-attr]
    return found


def counting(base_url: str) -> list[dict[str, Any]]:
    tokens = LlamaServerTokens(f"{base_url}/v1", 30.0)
    rows = []
    for label, messages, tools in prompts():
        exact = tokens.count(to_openai(messages), [{"type": "function", "function": t} for t in tools])
        assert exact is not None, "llama-server did not count"
        estimated = Heuristic().messages(messages) + Heuristic().tools(tools)
        rows.append({"prompt": label, "exact": exact, "heuristic": round(estimated), "over": estimated / exact})
    return rows


def assembly() -> list[dict[str, Any]]:
    rows = []
    for turns in (5, 50, 250, 500):
        body = _history(turns, 2000, turns, False)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            assemble(instructions=[Message(role="system", content="i")], task=[goal_message({})], constraints=[],
                     tools=[], transcript=body, budgets=ContextBudget(window=4096).resolve(None, None))
            times.append((time.perf_counter() - started) * 1000)
        rows.append({"messages": len(body), "median_ms": round(statistics.median(times), 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-server", action="store_true")
    args = parser.parse_args()
    print("assembly over budget (4,096-token window, 2,000-character results):")
    for row in assembly():
        print(f"  {row['messages']:5d} messages: {row['median_ms']} ms")
    if args.no_server:
        return
    from agentfleet.testing.local_model import QWEN25_CODER_1_5B, LlamaServer, ensure_model, server_binary

    with LlamaServer(server_binary(), QWEN25_CODER_1_5B, ensure_model(QWEN25_CODER_1_5B), context=4096) as server:
        rows = counting(server.base)
    print("heuristic against llama-server's tokenizer (Qwen2.5-Coder-1.5B):")
    for row in rows:
        print(f"  {row['exact']:6d} exact {row['heuristic']:6d} heuristic  x{row['over']:.2f}  {row['prompt']}")
    over = [r["over"] for r in rows]
    print(f"heuristic / exact: min {min(over):.2f}, median {statistics.median(over):.2f}, max {max(over):.2f} "
          f"over {len(rows)} prompts; under-counted: {sum(o < 1 for o in over)}")


if __name__ == "__main__":
    main()
