"""What the loop does next, decided from data alone.

The planner hands a model turn here and gets back one of three decisions; the
observer asks whether an iteration's fan-in is complete. No I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.errors import ErrorCode
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall

# The same set of calls this many iterations in a row is a loop, not progress.
NO_PROGRESS_REPEATS = 3


@dataclass(frozen=True)
class Dispatch:
    """Run these tool calls in parallel, then observe."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Finish:
    """The model gave a final answer that fits the agent's result schema."""

    output: dict[str, Any]


@dataclass(frozen=True)
class Fail:
    code: ErrorCode
    message: str
    details: list[str] = field(default_factory=list)


Decision = Dispatch | Finish | Fail


def schema_errors(schema: dict[str, Any], instance: Any, limit: int = 10) -> list[str]:
    """Human-readable JSON Schema violations, empty when the instance is valid."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    out = []
    for err in errors[:limit]:
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        out.append(f"{where}: {err.message}")
    return out


def calls_signature(calls: Iterable[ToolCall]) -> str:
    """Order-free fingerprint of a set of calls (names and arguments, not ids)."""
    parts = sorted(json.dumps([c.name, c.arguments], sort_keys=True, default=str) for c in calls)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def plan_signatures(transcript: Iterable[Message]) -> list[str]:
    """Signatures of the call sets the model made so far, oldest first: read off the transcript the
    planner already holds, rather than stored a second time and fetched again."""
    return [calls_signature(m.tool_calls) for m in transcript if m.role == "assistant" and m.tool_calls]


def decide(turn: ModelTurn, result_schema: dict[str, Any], previous_signatures: Sequence[str] = ()) -> Decision:
    """Turn a model's answer into the loop's next move."""
    finals = [c for c in turn.tool_calls if c.name == FINAL_ANSWER_TOOL]
    if finals:
        return _finish(finals[-1].arguments, result_schema)
    if not turn.tool_calls:
        return _finish_from_text(turn.text, result_schema)
    calls = _unique_ids(turn.tool_calls)
    signature = calls_signature(calls)
    recent = list(previous_signatures[-(NO_PROGRESS_REPEATS - 1) :])
    if len(recent) == NO_PROGRESS_REPEATS - 1 and all(s == signature for s in recent):
        return Fail(
            ErrorCode.NO_PROGRESS,
            f"the model made the same tool calls {NO_PROGRESS_REPEATS} iterations in a row",
        )
    return Dispatch(calls=calls)


def fan_in_complete(expected_call_ids: Iterable[str], received_call_ids: Iterable[str]) -> bool:
    return set(expected_call_ids) <= set(received_call_ids)


def waits_on_people(expected_call_ids: Iterable[str], received_call_ids: Iterable[str],
                    parked_call_ids: Iterable[str]) -> bool:
    """True when the iteration's only outstanding calls are parked for an answer: nothing else runs,
    so the run waits (WAITING_APPROVAL) rather than executes."""
    outstanding = set(expected_call_ids) - set(received_call_ids)
    return bool(outstanding) and outstanding <= set(parked_call_ids)


def _finish(output: Any, result_schema: dict[str, Any]) -> Decision:
    if not isinstance(output, dict):
        return Fail(ErrorCode.OUTPUT_INVALID, "the final answer is not a JSON object")
    problems = schema_errors(result_schema, output)
    if problems:
        return Fail(ErrorCode.OUTPUT_INVALID, "the final answer breaks the agent's result schema", problems)
    return Finish(output=output)


def _finish_from_text(text: str | None, result_schema: dict[str, Any]) -> Decision:
    if not text:
        return Fail(ErrorCode.MODEL_ERROR, "the model returned neither tool calls nor a final answer")
    try:
        parsed = json.loads(text)
    except ValueError:
        return Fail(
            ErrorCode.OUTPUT_INVALID,
            f"the model answered in prose instead of calling {FINAL_ANSWER_TOOL}",
            [text[:200]],
        )
    return _finish(parsed, result_schema)


def _unique_ids(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """Models occasionally reuse a call id within one turn; ids must be unique to fan in."""
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        call_id = call.id if call.id not in seen else f"{call.id}#{i}"
        seen.add(call_id)
        out.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return tuple(out)
