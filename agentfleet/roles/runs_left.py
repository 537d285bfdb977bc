"""The runs as this process's planner last committed them: the next iteration's handling takes its run from here,
moved on as the observer's event says, instead of reading it (one round trip fewer an iteration, issue 23).

Only ever a guess. The store checks it with the transaction that uses it (``Runs.hold_and_lock``: the row's version,
state and everything written without a move); a guess that is wrong fails that transaction whole, and the run is read
as before. A second planner process, a restart or an evicted entry only costs the read.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

from agentfleet.loop.states import RunState
from agentfleet.store.records import RunRecord

KEPT = 4096  # runs remembered; a run's entry is a few hundred bytes besides its input and limits, which are shared


class RunsLeft:
    """A bounded map from run id to the run as the last commit of this process's planner left it, least recently
    kept dropped first. Safe for the worker's threads."""

    def __init__(self, size: int = KEPT) -> None:
        self._size = size
        self._runs: OrderedDict[str, RunRecord] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, run: RunRecord) -> None:
        with self._lock:
            self._runs[run.run_id] = run
            self._runs.move_to_end(run.run_id)
            while len(self._runs) > self._size:
                self._runs.popitem(last=False)

    def take(self, run_id: str) -> RunRecord | None:
        """The run as left, forgotten here: the handling that takes it commits the run's next state."""
        with self._lock:
            return self._runs.pop(run_id, None)

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
            return dataclasses.replace(left, state=RunState.OBSERVING, version=left.version + 1)
        return None
