"""Builds the model's context from a run's transcript under a token budget.

Pure: data in, data out. When the transcript is over budget the oldest tool
results are elided first (they are the bulk and the model has already acted on
them); instructions, the goal and the latest turn are always kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.loop.transcript import MESSAGES, Message, message_chars

# A rough, provider-neutral estimate; adapters report exact usage after each call. Counting exactly before
# the call would need each provider's tokenizer, and neither is installable offline (tiktoken downloads
# its tables on first use; Anthropic counts over the network), so the budget errs on the safe side instead.
CHARS_PER_TOKEN = 4
# Of a model's context window, the share the prompt may fill: the rest is the answer's, and the margin for
# an estimate that runs short.
PROMPT_SHARE_OF_WINDOW = 0.75


def estimate_tokens(messages: Sequence[Message]) -> int:
    return len(MESSAGES.dump_json(list(messages), exclude_none=True)) // CHARS_PER_TOKEN + 1


def tokens_for(chars: int, count: int) -> int:
    """``estimate_tokens`` of ``count`` messages whose ``message_chars`` add up to ``chars``, without serializing
    them again: the JSON of a list is its items, the commas between them and two brackets."""
    return (2 + chars + max(0, count - 1)) // CHARS_PER_TOKEN + 1


def context_budget(max_tokens: int, context_window: int | None) -> int:
    """Tokens the prompt may take: the run's budget, and no more than the model's window allows."""
    if not context_window:
        return max_tokens
    return max(1, min(max_tokens, int(context_window * PROMPT_SHARE_OF_WINDOW)))


def system_prompt(instructions: str) -> str:
    return (
        f"{instructions.strip()}\n\n"
        f"Call tools to gather what you need; independent calls may be made in parallel. "
        f"When done, call `{FINAL_ANSWER_TOOL}` once with the result object."
    )


def goal_message(goal_input: dict[str, Any]) -> Message:
    return Message(role="user", content=json.dumps({"goal": goal_input}, sort_keys=True))


def build_messages(
    instructions: str,
    goal_input: dict[str, Any],
    transcript: Sequence[Message],
    budget_tokens: int,
    notice: str | None = None,
    examples: Sequence[Message] = (),
    transcript_chars: int | None = None,
) -> list[Message]:
    """The messages for one model call; ``examples`` (the agent's worked exchange) come before the goal,
    ``notice`` (which tools are unavailable now, and why) last, as it is about this turn only.
    ``transcript_chars``: the transcript's ``message_chars`` summed, when the caller keeps it (``History``): a
    prompt within budget then costs nothing per message of the transcript."""
    head = [Message(role="system", content=system_prompt(instructions)), *examples, goal_message(goal_input)]
    tail = [Message(role="system", content=notice)] if notice else []
    if transcript_chars is None:
        total = estimate_tokens([*head, *transcript, *tail])
    else:
        framing = sum(map(message_chars, head)) + sum(map(message_chars, tail))
        total = tokens_for(framing + transcript_chars, len(head) + len(transcript) + len(tail))
    if total <= budget_tokens:
        return [*head, *transcript, *tail]
    body = list(transcript)
    # Elide oldest tool results until we fit; never the last assistant turn's results.
    last_assistant = max((i for i, m in enumerate(body) if m.role == "assistant"), default=-1)
    for i, message in enumerate(body):
        if total <= budget_tokens:
            break
        if message.role != "tool" or i > last_assistant or not message.content:
            continue
        before = estimate_tokens([message])
        body[i] = message.model_copy(
            update={"content": json.dumps({"elided": True, "chars": len(message.content)})}
        )
        total -= before - estimate_tokens([body[i]])
    return head + body + tail
