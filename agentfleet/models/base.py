"""The seam every model adapter fills: one request in, one turn out.

Adapters are stateless across calls: any planner process may serve any
iteration of any run, so everything a model needs is in the request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from agentfleet.loop.transcript import Message, ModelTurn, Usage


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
    planner builds; adapters of real models set it. ``longest_call_s``: the longest one call can take, for a model
    that can say (one computed in the process, played back); with it the planner may ask for a turn before writing
    anything of the iteration (``loop/recovery.model_first``). A network's model cannot say: its HTTP timeouts bound
    each read, not the call."""

    name: str
    # True when turns are played back, not generated: the CLI says so on screen.
    offline: bool

    def complete(self, request: ModelRequest) -> ModelTurn: ...


OUTPUT_ESTIMATE_TOKENS = 1024  # what a turn is expected to write, when its model cannot say


def estimated_usage(model: Any, request: ModelRequest, prompt_tokens: int, prices: Mapping[str, Any]) -> Usage:
    """What a turn is expected to cost before it is taken (its reservation in a tree's budget): the model's own
    estimate where it has one (``estimate(request) -> Usage``: a scripted or replayed model knows its turn),
    else ``prompt_tokens`` (the caller's count of the prompt) and an output allowance, priced from the table."""
    own = getattr(model, "estimate", None)
    if callable(own):
        said = own(request)
        if isinstance(said, Usage):
            return said
    from agentfleet.models.pricing import usage_of

    return usage_of(str(getattr(model, "name", "")), prompt_tokens, OUTPUT_ESTIMATE_TOKENS, 0, prices)
