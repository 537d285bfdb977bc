"""What the loop does next, decided from data alone.

The planner hands a model turn here and gets back one of four decisions; the
observer asks whether an iteration's fan-in is complete. No I/O.

A turn the loop cannot use (tool arguments that are not JSON, a tool the agent
does not have, an empty, cut-off or off-schema answer) is told back to the model
as a ``Repair`` while the run has repairs left, and fails the run with that
turn's code once it has none: small and local models make these mistakes often
and correct them when told exactly what was wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.errors import ErrorCode
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall, ToolResult

# The same set of calls this many iterations in a row is a loop, not progress.
NO_PROGRESS_REPEATS = 3
# What a call id or tool name may hold: they end up in varchar columns, AMQP headers and log lines.
_UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
MAX_ARGUMENT_DEPTH = 64


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


@dataclass(frozen=True)
class Repair:
    """Tell the model why its turn was unusable and ask again: ``answers`` reply to each call of the turn
    by id (so every provider's transcript stays well-formed), ``note`` says what to do instead. ``fail``
    is the decision once no repairs are left."""

    answers: tuple[tuple[ToolCall, ToolResult], ...]
    note: str
    fail: Fail


Decision = Dispatch | Finish | Fail | Repair


def schema_errors(schema: dict[str, Any], instance: Any, limit: int = 10) -> list[str]:
    """Human-readable JSON Schema violations, empty when the instance is valid."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    out = []
    for err in errors[:limit]:
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        out.append(f"{where}: {err.message}")
    return out


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (draft 2020-12), or None: it is."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return None


def calls_signature(calls: Iterable[ToolCall]) -> str:
    """Order-free fingerprint of a set of calls (names and arguments, not ids)."""
    parts = sorted(json.dumps([c.name, c.arguments], sort_keys=True, default=str) for c in calls)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def plan_signatures(transcript: Sequence[Message], last: int | None = None) -> list[str]:
    """Signatures of the call sets the model made so far, oldest first: read off the transcript the
    planner already holds, rather than stored a second time and fetched again. ``last``: only the most recent
    that many, read from the end (what ``decide`` looks at: a long run's check must not cost more each turn)."""
    if last is None:
        return [calls_signature(m.tool_calls) for m in transcript if m.role == "assistant" and m.tool_calls]
    found: list[str] = []
    for m in reversed(transcript):
        if len(found) >= last:
            break
        if m.role == "assistant" and m.tool_calls:
            found.append(calls_signature(m.tool_calls))
    return found[::-1]


def usable_turn(turn: ModelTurn) -> ModelTurn:
    """The turn as the fleet can store, send and decide on it: model output is input.

    A call id with a NUL, a control character or a lone surrogate (Postgres refuses them in text; headers
    and logs mangle them) is replaced by one made from its position; a tool name with them is shown
    escaped and its call marked malformed; arguments holding NaN or Infinity (not JSON: stored as null,
    they would run a tool on values the model never sent), a NUL or a lone surrogate, or nested past
    ``MAX_ARGUMENT_DEPTH``, mark the call malformed. Malformed calls make the turn unusable: it is told
    back to the model like any other (``decide``)."""
    if not turn.tool_calls:
        return turn
    calls: list[ToolCall] = []
    malformed = dict(turn.malformed)
    for i, call in enumerate(turn.tool_calls):
        fixed: dict[str, Any] = {}
        if _UNSAFE_TEXT.search(call.id):
            fixed["id"] = f"call-{i}"
            malformed.setdefault(fixed["id"], "the call id holds control characters")
        if _UNSAFE_TEXT.search(call.name):
            fixed["name"] = call.name.encode("unicode_escape", "backslashreplace").decode("ascii")[:128]
        call_id = fixed.get("id", call.id)
        if "name" in fixed:
            malformed.setdefault(call_id, f"the tool name \"{fixed['name']}\" holds control characters")
        problem = _argument_problem(call.arguments, 0)
        if problem:
            fixed["arguments"] = {}
            malformed.setdefault(call_id, f"the arguments are not plain JSON: {problem}")
        if call.id in malformed and call_id != call.id:
            malformed[call_id] = malformed.pop(call.id)
        calls.append(call.model_copy(update=fixed) if fixed else call)
    if calls == turn.tool_calls and malformed == turn.malformed:
        return turn
    return turn.model_copy(update={"tool_calls": calls, "malformed": malformed})


def _argument_problem(value: Any, depth: int) -> str | None:
    if depth > MAX_ARGUMENT_DEPTH:
        return f"nested deeper than {MAX_ARGUMENT_DEPTH}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a JSON number"
    if isinstance(value, str):
        return "a string holds a NUL or a lone surrogate" if _bad_string(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _bad_string(key):
                return "a key holds a NUL or a lone surrogate"
            found = _argument_problem(item, depth + 1)
            if found:
                return found
    if isinstance(value, list):
        for item in value:
            found = _argument_problem(item, depth + 1)
            if found:
                return found
    return None


def _bad_string(text: str) -> bool:
    return "\x00" in text or re.search("[\ud800-\udfff]", text) is not None


def decide(turn: ModelTurn, result_schema: dict[str, Any], previous_signatures: Sequence[str] = (), *,
           tools: Collection[str] | None = None, repairs_left: int = 0, max_calls: int | None = None) -> Decision:
    """Turn a model's answer into the loop's next move. ``tools`` are the agent's tool names (a call to any
    other is unusable; None: not checked here); ``repairs_left`` how many more unusable turns may be told
    back to the model rather than end the run; ``max_calls`` how many tool calls a turn may make (more is
    unusable: nothing of it runs)."""
    decision = _decide(usable_turn(turn), result_schema, previous_signatures, tools, max_calls)
    if isinstance(decision, Repair) and repairs_left <= 0:
        return decision.fail
    return decision


def _decide(turn: ModelTurn, result_schema: dict[str, Any], previous_signatures: Sequence[str],
            tools: Collection[str] | None, max_calls: int | None) -> Decision:
    calls = _unique_ids(turn.tool_calls)
    if max_calls is not None and len(calls) > max_calls:
        return _repair(calls, {}, ErrorCode.TOO_MANY_CALLS,
                       f"the answer made {len(calls)} tool calls; at most {max_calls} are allowed in one turn",
                       f"Make at most {max_calls} calls now; the rest can follow in later turns.")
    if turn.stop_reason == "unparsed":  # the server could not read the answer (models/provider.py)
        return _repair(calls, {}, ErrorCode.MODEL_ERROR, "the answer could not be read as text or tool calls",
                       "Answer with one JSON object naming a tool and its arguments, or final_answer.",
                       [turn.text or ""])
    if turn.stop_reason == "length":
        return _repair(calls, {}, ErrorCode.MODEL_ERROR, "the answer was cut off at the output token limit",
                       "Answer again, shorter: one tool call with small arguments, or final_answer.")
    bad = {c.id: (ErrorCode.INVALID_ARGUMENTS, turn.malformed[c.id]) for c in calls if c.id in turn.malformed}
    unknown = [c for c in calls if tools is not None and c.name != FINAL_ANSWER_TOOL and c.name not in tools]
    # Arguments that did not parse would run a tool with none: the whole turn goes back. An unknown tool
    # beside usable calls does not hold them up (the executor answers it UNKNOWN_TOOL); alone, it goes back.
    if bad or (unknown and len(unknown) == len(calls)):
        known = ", ".join([*sorted(tools or ()), FINAL_ANSWER_TOOL])
        bad |= {c.id: (ErrorCode.UNKNOWN_TOOL, f"there is no tool named {c.name!r}; the tools are: {known}")
                for c in unknown if c.id not in bad}
        code = next(iter(bad.values()))[0]
        return _repair(calls, bad, code, "unusable tool calls: " + "; ".join(why for _, why in bad.values()),
                       "Send the calls again, each naming one of the tools, with a JSON object of arguments.")
    finals = [c for c in calls if c.name == FINAL_ANSWER_TOOL]
    if finals and len(finals) == len(calls):
        return _finish(finals[-1].arguments, result_schema, calls)
    # A final answer beside other calls was written before their results were in (a guess, measured: a small model
    # answered word counts it had asked a tool for in the same turn): the calls run, and the executor answers the
    # final answer NOT_RUN, so the model answers again with the results in hand.
    if not calls:
        return _finish_from_text(turn.text, result_schema)
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


def _finish(output: Any, result_schema: dict[str, Any], calls: Sequence[ToolCall] = ()) -> Decision:
    if not isinstance(output, dict):
        return _repair(calls, {}, ErrorCode.OUTPUT_INVALID, "the final answer is not a JSON object",
                       f"Call {FINAL_ANSWER_TOOL} with a JSON object that fits its parameters.")
    problems = schema_errors(result_schema, output)
    if problems:
        return _repair(calls, {}, ErrorCode.OUTPUT_INVALID, "the final answer breaks the agent's result schema",
                       f"Call {FINAL_ANSWER_TOOL} again with arguments that fit its parameters.", problems)
    return Finish(output=output)


def _finish_from_text(text: str | None, result_schema: dict[str, Any]) -> Decision:
    if not text or not text.strip():
        return _repair((), {}, ErrorCode.MODEL_ERROR, "the model returned neither tool calls nor a final answer",
                       f"Call one of the tools, or {FINAL_ANSWER_TOOL} with the result.")
    try:
        parsed = json.loads(text)
    except ValueError:
        return _repair((), {}, ErrorCode.OUTPUT_INVALID,
                       f"the model answered in prose instead of calling {FINAL_ANSWER_TOOL}",
                       f"Call {FINAL_ANSWER_TOOL} with the result as its arguments.", [text[:200]])
    return _finish(parsed, result_schema)


def _repair(calls: Sequence[ToolCall], bad: dict[str, tuple[ErrorCode, str]], code: ErrorCode, message: str,
            ask: str, details: Sequence[str] = ()) -> Repair:
    """Every call of the turn answered by id: the bad ones with why, the others as not run (nothing of an
    unusable turn runs, so a corrected turn never repeats a side effect)."""
    said = message + (": " + "; ".join(details) if details else "")

    def answer(call: ToolCall) -> ToolResult:
        if call.id in bad:
            return ToolResult.failure(bad[call.id][0], bad[call.id][1], hint=ask)
        if bad:
            return ToolResult.failure(ErrorCode.NOT_RUN, "not run: another call of the same turn was unusable",
                                      hint=ask)
        return ToolResult.failure(code, said, hint=ask)

    return Repair(answers=tuple((c, answer(c)) for c in calls),
                  note=f"Your last answer could not be used: {said}. {ask}", fail=Fail(code, message, list(details)))


def _unique_ids(calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    """Models occasionally reuse a call id within one turn; ids must be unique to fan in."""
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        call_id = call.id if call.id not in seen else f"{call.id}#{i}"
        seen.add(call_id)
        out.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return tuple(out)
