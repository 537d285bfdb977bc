"""The fixed pieces of a model's context (the system prompt, the goal message), and the rough size of a list of
messages that the fleet-wide rate limit reserves before a call. Assembling a call's context under its budgets is
``context.assemble``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.context.counting import Heuristic, whole
from agentfleet.loop.transcript import Message


def estimate_tokens(messages: Sequence[Message]) -> int:
    """The heuristic's count of ``messages`` (context/counting.py): what a call is reserved before it is made."""
    return whole(Heuristic().messages(messages))


def system_prompt(instructions: str) -> str:
    return (
        f"{instructions.strip()}\n\n"
        f"Call tools to gather what you need; independent calls may be made in parallel. "
        f"When done, call `{FINAL_ANSWER_TOOL}` once with the result object."
    )


def goal_message(goal_input: dict[str, Any]) -> Message:
    return Message(role="user", content=json.dumps({"goal": goal_input}, sort_keys=True))
