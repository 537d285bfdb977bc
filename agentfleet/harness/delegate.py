"""The built-in ``delegate`` tool's declaration: what a model is offered when its agent may delegate.

The executor handles its calls (tasks/delegation.py): no function runs, a child run starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentfleet.constants import DELEGATE_TOOL
from agentfleet.errors import ErrorCode, ToolError
from agentfleet.harness.tool import Tool, declare


def _handled_by_the_executor(**_: Any) -> Any:
    raise ToolError("delegate runs only as a step of a fleet run", code=ErrorCode.INTERNAL)


def delegate_tool(agents: Sequence[str]) -> Tool:
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
    return declare(DELEGATE_TOOL, f"Hand a task to another agent ({', '.join(names)}) and get its result back. "
                                   "Several delegations in one turn run in parallel.", schema,
                   func=_handled_by_the_executor)
