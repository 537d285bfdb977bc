"""The built-in ``delegate`` tool's declaration: what a model is offered when its agent may delegate.

The executor handles its calls (tasks/delegation.py): no function runs, a child run starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentfleet.constants import DELEGATE_TOOL
from agentfleet.errors import ErrorCode, ToolError
from agentfleet.tools.options import ToolOptions
from agentfleet.tools.tool import Tool, declare

ABOUT_CHARS = 300  # of a delegate's instructions, in the tool's description
SCHEMA_CHARS = 1200  # of its goal schema


def _handled_by_the_executor(**_: Any) -> Any:
    raise ToolError("delegate runs only as a step of a fleet run", code=ErrorCode.INTERNAL)


def delegate_tool(agents: Sequence[str], described: Mapping[str, tuple[str, dict[str, Any]]] | None = None) -> Tool:
    """The tool for delegating to ``agents``; ``described``: each one's instructions and goal schema, once the
    fleet's agents are loaded. A model sees only the tool's spec: without them it can only guess the input."""
    names = list(dict.fromkeys(agents))
    schema = {
        "type": "object",
        "properties": {
            "agent": {"type": "string", "enum": names, "description": "The agent to hand the task to"},
            "input": {"type": "object", "description": "That agent's goal input (it sees nothing else)"},
        },
        "required": ["agent", "input"],
        "additionalProperties": False,
    }
    said = (f"Hand a task to another agent ({', '.join(names)}) and get its result back. "
            "Several delegations in one turn run in parallel.")
    for name in names:
        if described and name in described:
            instructions, goal_schema = described[name]
            said += (f"\n- {name}: {_short(instructions, ABOUT_CHARS)} Its input: "
                     f"{_short(json.dumps(goal_schema, sort_keys=False), SCHEMA_CHARS)}")
    return declare(DELEGATE_TOOL, said, schema, ToolOptions(), func=_handled_by_the_executor)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
