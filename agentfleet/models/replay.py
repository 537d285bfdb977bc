"""Plays back recorded model turns from a cassette file: no network, no API key.

A cassette records a model's decisions, one turn per iteration. Values a model
copied out of what it was shown are recorded as references, so a replay stays
true on any input:

* ``{"$goal": "/path"}`` — a JSON Pointer into the goal's input;
* ``{"$result": "call_id", "pointer": "/output/total_lines"}`` — into an earlier
  tool call's result as the model saw it (``{"ok": ..., "output": ...}``), with an
  optional ``"default"`` for when that call failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentfleet.errors import ConfigurationError, ModelError
from agentfleet.loop.transcript import ModelTurn, ToolCall, Usage
from agentfleet.models.base import ModelRequest


class RecordedTurn(BaseModel):
    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)


class Cassette(BaseModel):
    model: str
    description: str = ""
    turns: list[RecordedTurn]


class ReplayModel:
    """A model that plays a cassette: turn N of the file answers iteration N (see the module's note for the
    ``$goal`` and ``$result`` references). For examples, demos and tests that need no network or key; a
    run that asks for a turn the cassette does not have fails with ``MODEL_ERROR`` (not retried)."""

    offline = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.cassette = Cassette.model_validate_json(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot load cassette {self.path}: {exc}") from exc
        self.name = f"replay:{self.cassette.model}"

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.iteration >= len(self.cassette.turns):
            raise ModelError(
                f"cassette {self.path.name} has {len(self.cassette.turns)} turns; "
                f"iteration {request.iteration} was not recorded"
            )
        recorded = self.cassette.turns[request.iteration]
        seen = request.tool_outputs()
        calls = [
            call.model_copy(update={"arguments": _resolve(call.arguments, request.goal, seen)})
            for call in recorded.tool_calls
        ]
        return ModelTurn(text=recorded.text, tool_calls=calls, usage=recorded.usage, model=self.name)


def _resolve(value: Any, goal: dict[str, Any], seen: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$goal"}:
            return _pointer(goal, value["$goal"], "goal")
        if "$result" in value and set(value) <= {"$result", "pointer", "default"}:
            call_id = value["$result"]
            if call_id not in seen:
                raise ModelError(f"cassette refers to result of call {call_id!r}, which this run has not seen")
            try:
                return _pointer(seen[call_id], value.get("pointer", ""), f"result of {call_id}")
            except ModelError:
                if "default" in value:
                    return value["default"]
                raise
        return {k: _resolve(v, goal, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, goal, seen) for v in value]
    return value


def _pointer(document: Any, pointer: str, what: str) -> Any:
    node = document
    for raw in pointer.split("/")[1:] if pointer else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            found = json.dumps(document, default=str)[:200]
            raise ModelError(f"cassette pointer {pointer!r} not found in {what}: {found}") from None
    return node
