"""Plays back recorded model turns from a cassette file: no network, no API key.

A cassette records a model's decisions, one turn per iteration. Two kinds:

* Hand-written: values a model copied out of what it was shown are written as
  references, so a replay stays true on any input —
  ``{"$goal": "/path"}`` (a JSON Pointer into the goal's input; an optional ``"default"``
  for an input that lacks it) and
  ``{"$result": "call_id", "pointer": "/output/total_lines"}`` (into an earlier tool
  call's result as the model saw it, ``{"ok": ..., "output": ...}``, with an optional
  ``"default"`` for when that call failed).
* Recorded from a real run (``agentfleet run --record``, models/recording.py): each
  turn keeps the request it answered (messages and a fingerprint), and the cassette the
  goal and the Result. Replaying it is *strict*: a request that differs from the
  recorded one (a tool now returns something else, the prompt changed) fails the run
  with the first differing message named — a production run as a regression test.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentfleet.errors import ConfigurationError, ModelError
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall, Usage
from agentfleet.models.base import ModelRequest


class RecordedTurn(BaseModel):
    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    stop_reason: str | None = None
    malformed: dict[str, str] = Field(default_factory=dict)
    # Recorded runs only: the request this turn answered, and its fingerprint.
    fingerprint: str | None = None
    messages: list[Message] | None = None
    tools: list[str] | None = None


class Cassette(BaseModel):
    model: str
    description: str = ""
    turns: list[RecordedTurn]
    # Recorded runs only: what was asked, of whom, and how it ended.
    agent: str | None = None
    goal: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


class ReplayDiverged(ModelError):
    """A strict replay met a request that differs from the recorded one."""


def fingerprint(request: ModelRequest) -> str:
    """What the model was shown (messages and tools offered), as a short stable hash."""
    shown = {"messages": [m.model_dump(mode="json", exclude_none=True) for m in request.messages],
             "tools": sorted(t.get("name", "") for t in request.tools)}
    return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()[:24]


def divergence(recorded: list[Message], now: list[Message]) -> str:
    """The first message that differs between a recorded request and today's, said for a person."""
    for i, (was, is_) in enumerate(zip(recorded, now, strict=False)):
        if was != is_:
            what = f"message {i} ({is_.role}" + (f", result of call {is_.tool_call_id}" if is_.tool_call_id else "")
            return (f"{what}) differs: recorded {_short(was.content, was.tool_calls)}; "
                    f"now {_short(is_.content, is_.tool_calls)}")
    if len(recorded) != len(now):
        return f"the request has {len(now)} messages; the recording has {len(recorded)}"
    return "the tools offered differ"


def _short(content: str | None, calls: list[ToolCall]) -> str:
    text = content if content is not None else json.dumps([[c.name, c.arguments] for c in calls], default=str)
    return text if len(text) <= 300 else text[:300] + "…"


class ReplayModel:
    """A model that plays a cassette: turn N of the file answers iteration N (see the module's note for the
    ``$goal`` and ``$result`` references). For examples, demos and tests that need no network or key; a
    run that asks for a turn the cassette does not have fails with ``MODEL_ERROR`` (not retried).

    A cassette recorded from a run (``agentfleet run --record``) is replayed strictly: each request must
    be the recorded one, or the run fails (``ReplayDiverged``, a ``MODEL_ERROR``) naming the first message
    that differs; ``checks`` keeps one line per iteration played. ``strict=False`` plays it loosely."""

    offline = True
    longest_call_s = 0.0  # played back from memory

    def __init__(self, path: str | Path, *, strict: bool | None = None) -> None:
        """``strict``: fail on a request that differs from the recorded one; by default, when the cassette
        was recorded from a run (its turns keep their requests)."""
        self.path = Path(path)
        try:
            self.cassette = Cassette.model_validate_json(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot load cassette {self.path}: {exc}") from exc
        self.name = f"replay:{self.cassette.model}"
        recorded = any(t.fingerprint for t in self.cassette.turns)
        self.strict = recorded if strict is None else strict
        # One line per iteration replayed: (iteration, matched, what differed); `agentfleet replay` reports it.
        self.checks: list[tuple[int, bool, str]] = []

    def estimate(self, request: ModelRequest) -> Usage | None:
        """The recorded usage of the turn it will replay (what a delegated run reserves in its tree's budget)."""
        if request.iteration >= len(self.cassette.turns):
            return None
        return self.cassette.turns[request.iteration].usage

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.iteration >= len(self.cassette.turns):
            raise ModelError(
                f"cassette {self.path.name} has {len(self.cassette.turns)} turns; "
                f"iteration {request.iteration} was not recorded"
            )
        recorded = self.cassette.turns[request.iteration]
        if self.strict and recorded.fingerprint:
            self._check(request, recorded)
        seen = request.tool_outputs()
        calls = [
            call.model_copy(update={"arguments": _resolve(call.arguments, request.goal, seen)})
            for call in recorded.tool_calls
        ]
        return ModelTurn(text=recorded.text, tool_calls=calls, usage=recorded.usage, model=self.name,
                         stop_reason=recorded.stop_reason, malformed=recorded.malformed)

    def _check(self, request: ModelRequest, recorded: RecordedTurn) -> None:
        """The recorded request, message by message when kept (an edited recording counts), else by hash."""
        if recorded.messages is not None:
            tools = [t.get("name", "") for t in request.tools]
            same = recorded.messages == request.messages and (recorded.tools is None or recorded.tools == tools)
        else:
            same = fingerprint(request) == recorded.fingerprint
        if same:
            self.checks.append((request.iteration, True, ""))
            return
        said = divergence(recorded.messages or [], request.messages)
        self.checks.append((request.iteration, False, said))
        raise ReplayDiverged(f"replay of {self.path.name} diverged at iteration {request.iteration}: {said}")


def _resolve(value: Any, goal: dict[str, Any], seen: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if "$goal" in value and set(value) <= {"$goal", "default"}:
            return _read(goal, value["$goal"], "goal", value)
        if "$result" in value and set(value) <= {"$result", "pointer", "default"}:
            call_id = value["$result"]
            if call_id not in seen:
                raise ModelError(f"cassette refers to result of call {call_id!r}, which this run has not seen")
            return _read(seen[call_id], value.get("pointer", ""), f"result of {call_id}", value)
        return {k: _resolve(v, goal, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, goal, seen) for v in value]
    return value


def _read(document: Any, pointer: str, what: str, reference: dict[str, Any]) -> Any:
    """A reference's value, or its ``default`` when the pointer finds nothing (a call that failed, say)."""
    try:
        return _pointer(document, pointer, what)
    except ModelError:
        if "default" in reference:
            return reference["default"]
        raise


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
