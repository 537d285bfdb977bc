"""The runs as this process last committed them: the next handling of a run takes it from here, moved on as its event
says, instead of reading it (one round trip fewer a handling, issue 23). The planner keeps the run it sent to its
tools and takes it back moved on by the observer's move (``observed``); the observer keeps the run it moved to
OBSERVING and takes it back moved on by the planner's moves, which the tool's result carries (``finished``). One map
a process: on one machine, where the roles share a process, each takes what the other left.

Only ever a guess. The store checks it with the transaction that uses it (``Runs.hold_and_lock``, ``Runs.hold_run``:
the row's version, state, iteration and everything written without a move); a guess that is wrong fails that
transaction whole, and the run is read as before. A second process of the role, a restart or an evicted entry only
costs the read.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from agentfleet.events.envelope import RunLeft
from agentfleet.loop.states import RunState
from agentfleet.store.records import RunRecord
from agentfleet.store.runs import UNVERSIONED

KEPT = 4096  # runs remembered at most
# What the runs remembered may weigh, their inputs as JSON (an input may be up to the inbox's limit, 1 MiB: by count
# alone a burst of large goals would hold thousands of them), and what an entry weighs besides its input.
KEPT_BYTES = 32 * 1024 * 1024
ENTRY_BYTES = 256


class RunsLeft:
    """A bounded map from run id to the run as the last commit of this process that moved it left it, least recently
    kept dropped first, bounded by count and by weight (``KEPT_BYTES``). Safe for the worker's threads."""

    def __init__(self, size: int = KEPT, budget: int = KEPT_BYTES) -> None:
        self._size, self._budget = size, budget
        self._runs: OrderedDict[str, tuple[RunRecord, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    @property
    def weight(self) -> int:
        """What the runs kept weigh now (their inputs as JSON, and ``ENTRY_BYTES`` each)."""
        return self._weight

    def keep(self, run: RunRecord) -> None:
        """Remember ``run``, unless it alone weighs more than the budget (it is read, as a run not known is). Weighed
        here, once a commit: the input's JSON, which a prompt of the run writes out every turn anyway."""
        weight = ENTRY_BYTES + len(json.dumps(run.input, separators=(",", ":"), default=str))
        with self._lock:
            self._forget(run.run_id)
            if weight > self._budget:
                return
            self._runs[run.run_id] = (run, weight)
            self._weight += weight
            while len(self._runs) > self._size or self._weight > self._budget:
                _, (_, dropped) = self._runs.popitem(last=False)
                self._weight -= dropped

    def take(self, run_id: str) -> RunRecord | None:
        """The run as left, forgotten here: the handling that takes it commits the run's next state."""
        with self._lock:
            return self._forget(run_id)

    def _forget(self, run_id: str) -> RunRecord | None:
        entry = self._runs.pop(run_id, None)
        if entry is None:
            return None
        self._weight -= entry[1]
        return entry[0]

    def observed(self, run_id: str, iteration: int) -> RunRecord | None:
        """The run as the observer's move of ``iteration`` left it, when this process's planner made the commit it
        moved on from: that commit sent the run's calls out (EXECUTING, at this iteration) and the observer's move to
        OBSERVING changes nothing but the state and the version (and the time, which is not used here); or that commit
        told a turn back for repair, and moved the run to OBSERVING itself. None when it cannot be known."""
        left = self.take(run_id)
        if left is None or left.iteration != iteration:
            return None
        if left.state == RunState.OBSERVING:
            return left
        if left.state == RunState.EXECUTING:
            return left.replace(state=RunState.OBSERVING, version=left.version + 1)
        return None

    def finished(self, run_id: str, left: RunLeft) -> RunRecord | None:
        """The run as the planner's commit that sent a call out left it (``left``, carried by the call's result), when
        this process knows the rest of the row: it kept the run at that version (on one machine, the planner's own
        commit), or at the version the planner's handling moved on from (this process's observer's move), the
        planner vouching that it changed nothing since but what ``left`` carries. None when it cannot be known."""
        kept = self.take(run_id)
        if kept is None or kept.version not in (left.version, left.from_version):
            return None
        if kept.version == left.from_version and kept.state != RunState.OBSERVING:
            return None  # the planner's handling moved on from an observer's move: only that is vouched for
        return kept.replace(version=left.version, state=left.state, iteration=left.iteration,
                            updated_at=left.updated_at, **{c: getattr(left, c) for c in UNVERSIONED})


def left_by(run: RunRecord, from_version: int | None = None) -> RunLeft:
    """What a call sent out by the commit that left ``run`` so carries for its observer; ``from_version``: the
    observer's move (OBSERVING) the committing handling moved on from, when its own moves since changed nothing but
    the state, the iteration, the time and the columns written without a move."""
    return RunLeft(version=run.version, state=run.state, iteration=run.iteration, updated_at=run.updated_at,
                   from_version=from_version, **{c: getattr(run, c) for c in UNVERSIONED})
