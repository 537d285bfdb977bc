"""A transcript's older turns, indexed once each as the run grows, so that compacting them costs a plan the same at
turn 3,000 as at turn 30.

Compaction (context/assemble.py) weighs every older turn as it is and with its old results compacted, and a folded
turn by its line. Walking them all on every plan made a plan past the window cost ~3 µs an older turn even with each
message's size remembered (benchmarks/README.md). Here each turn is weighed once, when it first becomes older, and the
weights are kept as running sums (``Index``): the weight of any run of turns is a difference of two sums, so the fold
points are found by halving. The index is kept with the run's ``History`` (``History.derived``), which hands it on to
the longer history ``plus`` makes: a plan indexes only the turns that became older since the last one.

Sums are integers (characters and message counts), so they are exact; the heuristic turns them into tokens where a
fold point is decided (``Index.exact_for``: only where every float the old walk added is exact too, so both ways
decide alike).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from agentfleet.context.compaction import Turn, compact_result, lined, turns_of
from agentfleet.context.counting import Heuristic
from agentfleet.loop.transcript import Derived, Message, message_chars


class _Columns:
    """Running sums over the turns of one history and its descendants, from 0: entry ``t`` sums turns ``0..t-1``.
    Append-only, shared by the views (``Index``) of every history grown from the same one; a view that finds turns
    appended past its own (another branch grown from the same history) copies its part before appending its own."""

    __slots__ = ("chars", "compacted", "guard", "lines", "messages", "odd", "results", "smaller", "starts", "text")

    def __init__(self) -> None:
        self.starts = array("q", [0])  # where each turn starts in the transcript; the last entry: where they end
        self.chars = array("q", [0])  # their messages' ``message_chars`` as they are
        self.compacted = array("q", [0])  # ... with old tool results compacted (layer 1)
        self.messages = array("q", [0])  # how many messages
        self.results = array("q", [0])  # how many tool results compacting changes
        self.lines = array("q", [0])  # their lines' ``escaped`` sizes (layer 2)
        self.odd = array("q", [0])  # turns that make halving unsafe (``Index.exact_for``)
        # Not sums: each older message as layer 1 leaves it (its own object if compacting changes nothing), and each
        # turn's line. A prompt past the window is mostly these (the recent turns, the summary's lines): slicing them
        # is what keeps a plan at a small fraction of a millisecond for a window of a thousand turns.
        self.smaller: list[Message] = []
        self.text: list[str] = []
        self.guard = threading.Lock()  # appending: a view checks it is the longest and appends as one step

    def truncated(self, turns: int) -> _Columns:
        copy = _Columns()
        for name in ("chars", "compacted", "lines", "messages", "odd", "results", "starts"):
            setattr(copy, name, getattr(self, name)[: turns + 1])
        copy.smaller, copy.text = self.smaller[: self.starts[turns]], self.text[:turns]
        return copy


# A fold is decided on floats: (chars / chars_per_token + per_message * count) * scale, summed turn by turn. With the
# default heuristic every such value is a multiple of a half and far below 2**52, so every sum and difference is exact
# and a difference of running sums is what the walk's additions gave, bit for bit.
_EXACT = Heuristic()
# A turn's line may weigh no more than the turn (its messages' chars plus this much a message) for halving to be safe:
# folding a turn then never makes the prompt larger, so "does it fit with s turns folded" only turns true as s grows.
_LINE_SLACK = int(_EXACT.per_message * _EXACT.chars_per_token)
_LIMIT = 2**40  # chars summed: far inside a double's exact integers even as halves


@dataclass(frozen=True)
class Index:
    """The first ``turns`` turns of a transcript, which end where its messages ``[:through]`` end."""

    columns: _Columns
    turns: int
    through: int
    last: Message | None  # ``transcript[through - 1]``: a view handed to another transcript is checked by it

    def covers(self, transcript: Sequence[Message], cut: int) -> bool:
        return self.through <= cut and (self.through == 0 or transcript[self.through - 1] is self.last)

    def exact_for(self, count: Heuristic) -> bool:
        """Whether halving decides exactly as walking the turns one by one did: the default heuristic (exact in
        floating point), sums within range, no compacted turn heavier than the turn, and no line heavier than its
        turn. A run that has one such turn is compacted by the walk (``assemble``), as before."""
        c = self.columns
        return (count == _EXACT and c.odd[self.turns] == 0 and c.chars[self.turns] < _LIMIT
                and c.lines[self.turns] < _LIMIT)

    def size(self, lo: int, hi: int, compacted_below: int = 0) -> tuple[int, int]:
        """Characters and messages of turns ``lo..hi-1``, those below ``compacted_below`` with results compacted."""
        c = self.columns
        mid = min(max(lo, compacted_below), hi)
        return (c.compacted[mid] - c.compacted[lo] + c.chars[hi] - c.chars[mid], c.messages[hi] - c.messages[lo])

    def lines(self, lo: int, hi: int) -> list[str]:
        """The lines of turns ``lo..hi-1``."""
        return self.columns.text[lo:hi]

    def messages(self, transcript: Sequence[Message], lo: int, compacted_below: int) -> list[Message]:
        """The messages of turns ``lo`` and later, those below ``compacted_below`` with their results compacted."""
        starts = self.columns.starts
        split = starts[max(lo, min(compacted_below, self.turns))]
        return [*self.columns.smaller[starts[lo]:split], *transcript[split:self.through]]


def index(transcript: Sequence[Message], cut: int, kept: Index | None = None) -> Index:
    """The turns of ``transcript[:cut]`` (``cut``: where its latest turn starts), from ``kept`` when that covers a
    part of this transcript (a shorter history's), weighing only the turns after it."""
    if kept is None or not kept.covers(transcript, cut):
        kept = Index(_Columns(), 0, 0, None)
    if kept.through == cut:
        return kept
    rows = []
    at, number = kept.through, kept.turns
    for turn in turns_of(transcript[kept.through:cut]):  # weighed first, appended together below
        number += 1
        ms = turn.messages
        chars = sum(map(message_chars, ms))
        smaller = [compact_result(m) if m.role == "tool" else m for m in ms]
        compacted = sum(map(message_chars, smaller))
        text, line_chars = lined(Turn(ms, number))
        at += len(ms)
        rows.append((at, chars, compacted, len(ms), sum(a is not b for a, b in zip(ms, smaller, strict=True)),
                     line_chars, compacted > chars or line_chars > compacted + _LINE_SLACK * len(ms), smaller, text))
    columns = kept.columns
    with columns.guard:  # two plans of one run at once (a redelivery): one appends, the other copies
        if len(columns.starts) - 1 != kept.turns:  # a sibling grew them past this view: copy this view's part
            columns = columns.truncated(kept.turns)
        for at, chars, compacted, count, results, line_chars, odd, smaller, text in rows:
            columns.starts.append(at)
            columns.chars.append(columns.chars[-1] + chars)
            columns.compacted.append(columns.compacted[-1] + compacted)
            columns.messages.append(columns.messages[-1] + count)
            columns.results.append(columns.results[-1] + results)
            columns.lines.append(columns.lines[-1] + line_chars)
            columns.odd.append(columns.odd[-1] + odd)
            columns.smaller += smaller
            columns.text.append(text)
    return Index(columns, number, cut, transcript[cut - 1])


def indexed(transcript: Sequence[Message], cut: int, derived: Derived | None) -> Index:
    """``index``, from the one a history keeps (``History.derived``), which then keeps the one returned."""
    kept = derived.value if derived is not None and isinstance(derived.value, Index) else None
    older = index(transcript, cut, kept)
    if derived is not None:
        derived.value = older
    return older

