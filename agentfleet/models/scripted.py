"""A model whose turns a test writes down, one per iteration."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.errors import ModelError
from agentfleet.loop.transcript import ModelTurn, ToolCall, Usage
from agentfleet.models.base import ModelRequest

Turn = ModelTurn | Callable[[ModelRequest], ModelTurn]
_AUTO = "~auto~"  # marks an id ScriptedModel.calls made up, to be made unique when the turn is played


class ScriptedModel:
    """A model for tests: iteration N gets turn N, a ``ModelTurn`` or a function of the ``ModelRequest``
    (which sees the goal, the transcript and ``request.tool_outputs()``). Build turns with
    ``ScriptedModel.calls(("tool", {...}), ...)`` (parallel calls in one turn) and
    ``ScriptedModel.final({...})`` (the answer that ends the run). A function may raise
    ``ModelUnavailable`` or ``ModelAuthError`` to act out a provider's failures."""

    offline = True

    def __init__(self, turns: Sequence[Turn], name: str = "scripted", *, longest_call_s: float | None = None) -> None:
        self.turns = list(turns)
        self.name = name
        # Turns written down are played at once; a function of the request may do anything (block, act out a
        # provider's failure, take its worker down), so it says nothing unless the test says how long it may take.
        written = all(isinstance(t, ModelTurn) for t in self.turns)
        self.longest_call_s = longest_call_s if longest_call_s is not None else (0.0 if written else None)

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.iteration >= len(self.turns):
            raise ModelError(f"{self.name} has no turn for iteration {request.iteration}")
        turn = self.turns[request.iteration]
        result = turn(request) if callable(turn) else turn
        calls = [c.model_copy(update={"id": f"i{request.iteration}-{c.id[len(_AUTO):]}"})
                 if c.id.startswith(_AUTO) else c for c in result.tool_calls]
        return result.model_copy(update={"model": self.name, "tool_calls": calls})

    def estimate(self, request: ModelRequest) -> Usage | None:
        """The usage of the turn it will give (its turns are written down; a function of the request is called
        on the same request): what a delegated run reserves in its tree's budget."""
        if request.iteration >= len(self.turns):
            return None
        turn = self.turns[request.iteration]
        try:
            return (turn(request) if callable(turn) else turn).usage
        except Exception:  # a turn that acts out a provider's failure: it will cost nothing
            return Usage()

    @staticmethod
    def calls(*calls: tuple[str, dict[str, Any]] | ToolCall, tokens: int = 10) -> ModelTurn:
        """A turn making these calls. Calls given as (name, args) get ids unique in the run (``i<iteration>-call<n>``,
        as a provider's are: a transcript matches results to calls by id)."""
        built = [c if isinstance(c, ToolCall) else ToolCall(id=f"{_AUTO}call{i}", name=c[0], arguments=c[1])
                 for i, c in enumerate(calls)]
        return ModelTurn(tool_calls=built, usage=Usage(input_tokens=tokens, output_tokens=tokens))

    @staticmethod
    def final(output: dict[str, Any], tokens: int = 10) -> ModelTurn:
        return ModelTurn(
            tool_calls=[ToolCall(id="final", name=FINAL_ANSWER_TOOL, arguments=output)],
            usage=Usage(input_tokens=tokens, output_tokens=tokens),
        )
