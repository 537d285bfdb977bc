"""A thread's earlier exchanges in a run's prompt: the newest whole while they fit the thread's share of the task,
older ones as a line each (as many as fit), the rest left out. Pure: the same exchanges give the same messages,
so a redelivered plan step shows the model what the first attempt did."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentfleet.context.builder import goal_message
from agentfleet.context.counting import Heuristic
from agentfleet.loop.transcript import Message

LINE_CHARS = 240  # an older exchange folded to a line: its goal and answer, each cut to fit this
WHOLE_SHARE = 0.75  # of the budget, for exchanges shown whole: the rest keeps a line each for older ones


def answer_of(exchange: dict[str, Any]) -> str:
    """What a run of the thread answered, as the model is shown it: its output, or how it failed."""
    result = exchange.get("result") or {}
    if result.get("status") == "succeeded":
        return json.dumps({"answer": result.get("output")}, sort_keys=True, default=str)
    return json.dumps({"failed": {"status": result.get("status"), "error_code": result.get("error_code"),
                                  "message": result.get("message")}}, sort_keys=True, default=str)


def thread_messages(exchanges: Sequence[dict[str, Any]], budget_tokens: float, counter: Heuristic) -> list[Message]:
    """``exchanges`` (oldest first: each a run's goal ``input`` and ``result``) as messages within
    ``budget_tokens``: a user turn (the goal) and an assistant turn (the answer) each for the newest that fit,
    preceded by one user message with a line each for as many older ones as fit beside them (whole exchanges
    after the newest stop at ``WHOLE_SHARE`` of the budget, so some of the older ones always show)."""
    whole: list[list[Message]] = []
    spent = 0.0
    cut = len(exchanges)
    for exchange in reversed(exchanges):
        pair = [goal_message(exchange.get("input") or {}), Message(role="assistant", content=answer_of(exchange))]
        cost = counter.messages(pair)
        if spent + cost > budget_tokens * (WHOLE_SHARE if cut < len(exchanges) else 1.0):  # the newest: any room
            break
        whole.insert(0, pair)
        spent += cost
        cut -= 1
    lines: list[str] = []
    header = "Earlier in this conversation (oldest first):"
    for exchange in reversed(exchanges[:cut]):
        goal = json.dumps(exchange.get("input") or {}, sort_keys=True, default=str)[: LINE_CHARS // 2]
        line = f"- {goal} → {answer_of(exchange)[: LINE_CHARS // 2]}"
        cost = counter.messages([Message(role="user", content="\n".join([header, line, *lines]))])
        if spent + cost > budget_tokens:
            break
        lines.insert(0, line)
    folded = [Message(role="user", content="\n".join([header, *lines]))] if lines else []
    return folded + [m for pair in whole for m in pair]
