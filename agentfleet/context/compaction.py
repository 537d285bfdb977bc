"""The three layers of compaction, each a pure function of the transcript (so a replay, or a redelivered plan
step, assembles the same context from the same checkpoint):

1. an old tool result becomes its reference and a short head (``compact_result``): the whole result stays in
   the run's transcript, readable with ``read_artifact(ref="result:<call id>")``;
2. a finished turn (a model turn whose calls all came back) becomes one line (``turn_line``);
3. the lines of older turns make the running summary (``summary_text``): when they outgrow its budget the
   oldest lines (where a task's facts are usually set out) and the newest are kept, the middle is counted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from agentfleet.constants import RESULT_REF_PREFIX
from agentfleet.loop.transcript import Message

RESULT_HEAD_CHARS = 160  # of a compacted tool result
LINE_ARGS_CHARS = 80  # of a call's arguments, in a turn's line
LINE_RESULT_CHARS = 100  # of a call's result, in a turn's line
SUMMARY_TITLE = "Earlier in this run (compacted; every tool result is still readable in full with read_artifact):"


@dataclass(frozen=True)
class Turn:
    """A model turn and the messages that answered it (tool results, a repair note), as the transcript has them."""

    messages: tuple[Message, ...]
    number: int  # its place among the run's turns, from 1


def turns_of(transcript: Sequence[Message]) -> list[Turn]:
    """The transcript cut at each model turn (messages before the first one, if any, form a turn of their own)."""
    cut: list[list[Message]] = []
    for message in transcript:
        if message.role == "assistant" or not cut:
            cut.append([])
        cut[-1].append(message)
    return [Turn(tuple(ms), n) for n, ms in enumerate(cut, start=1)]


def latest_turn_at(transcript: Sequence[Message]) -> int:
    """Where the latest turn starts (its model turn's index; 0 if there is none), looking from the end only."""
    for i in range(len(transcript) - 1, -1, -1):
        if transcript[i].role == "assistant":
            return i
    return 0


def result_ref(call_id: str) -> str:
    return f"{RESULT_REF_PREFIX}{call_id}"


def compact_result(message: Message) -> Message:
    """A tool result as its reference, its size and its head (layer 1). Already compact results, and results
    shorter than what would replace them, stay as they are."""
    content = message.content or ""
    if not message.tool_call_id or len(content) <= RESULT_HEAD_CHARS + 80 or _is_compacted(content):
        return message
    view = {"compacted": True, "ref": result_ref(message.tool_call_id), "chars": len(content),
            "head": content[:RESULT_HEAD_CHARS]}
    return message.model_copy(update={"content": json.dumps(view, sort_keys=True)})


def _is_compacted(content: str) -> bool:
    return content.startswith('{"chars": ') and '"compacted": true' in content


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def turn_line(turn: Turn) -> str:
    """One line for a finished turn (layer 2): what was called with what, what came back, where to read it."""
    return lined(turn)[0]


def lined(turn: Turn) -> tuple[str, int]:
    """``turn_line`` and what it adds to the summary message's ``message_chars`` (``escaped``). Written once a turn,
    when it first becomes older: the run's index keeps both (context/older.py)."""
    line = _line(turn)
    return line, escaped(line)


def escaped(line: str) -> int:
    """What a line adds to the summary message's ``message_chars``: its JSON-escaped UTF-8, and the newline."""
    return len(json.dumps(line, ensure_ascii=False).encode())


def _line(turn: Turn) -> str:
    head, rest = turn.messages[0], turn.messages[1:]
    results = {m.tool_call_id: m.content or "" for m in rest if m.role == "tool"}
    parts = []
    if head.role == "assistant":
        if head.content:
            parts.append(f"said {json.dumps(_clip(head.content, LINE_RESULT_CHARS))}")
        for call in head.tool_calls:
            args = _clip(json.dumps(call.arguments, sort_keys=True, default=str), LINE_ARGS_CHARS)
            got = _clip(results.get(call.id, "(no result)"), LINE_RESULT_CHARS)
            parts.append(f"{call.name}({args}) -> {got} [{result_ref(call.id)}]")
    notes = [m for m in rest if m.role != "tool"]
    if head.role != "assistant":
        notes = list(turn.messages)
    parts += [f"{m.role}: {_clip(m.content or '', LINE_RESULT_CHARS)}" for m in notes]
    return f"turn {turn.number}: " + "; ".join(parts or ["(empty)"])


def summary_text(lines: Sequence[str], keep_first: int, keep_last: int, head: str | None = None) -> str:
    """The running summary (layer 3): the first ``keep_first`` and last ``keep_last`` lines, the rest counted;
    ``head``, a summary a model wrote of the turns before these lines, first."""
    if keep_first + keep_last >= len(lines):
        body = list(lines)
    else:
        omitted = len(lines) - keep_first - keep_last
        body = [*lines[:keep_first], f"… {omitted} turn(s) omitted here; their results stay readable by reference "
                                     f"({RESULT_REF_PREFIX}<call id>) …", *lines[len(lines) - keep_last:]]
    return "\n".join([SUMMARY_TITLE, *([head] if head else []), *body])
