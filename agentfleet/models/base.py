"""The seam every model adapter fills: one request in, one turn out.

Adapters are stateless across calls: any planner process may serve any
iteration of any run, so everything a model needs is in the request.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from agentfleet.loop.transcript import Message, ModelTurn


class ModelRequest(BaseModel):
    run_id: str
    agent: str
    iteration: int
    goal: dict[str, Any]
    messages: list[Message]
    tools: list[dict[str, Any]] = Field(default_factory=list)

    def tool_outputs(self) -> dict[str, Any]:
        """Results of earlier tool calls in this run, by call id (what the model has 'seen')."""
        out: dict[str, Any] = {}
        for message in self.messages:
            if message.role == "tool" and message.tool_call_id and message.content:
                try:
                    out[message.tool_call_id] = json.loads(message.content)
                except ValueError:
                    out[message.tool_call_id] = message.content
        return out


@runtime_checkable
class Model(Protocol):
    """``complete`` answers one request. Optional: ``context_window`` (tokens), which bounds the prompt the
    planner builds; adapters of real models set it."""

    name: str
    # True when turns are played back, not generated: the CLI says so on screen.
    offline: bool

    def complete(self, request: ModelRequest) -> ModelTurn: ...
