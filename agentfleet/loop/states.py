"""The run state machine: states and the one table of legal transitions.

The store enforces this table with a compare-and-set on ``(state, version)``.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    PENDING = "PENDING"
    PLANNING = "PLANNING"
    EXECUTING = "EXECUTING"
    OBSERVING = "OBSERVING"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    WAITING_CHILDREN = "WAITING_CHILDREN"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL: frozenset[RunState] = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
_ENDINGS = {RunState.FAILED, RunState.CANCELLED}

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.PLANNING, *_ENDINGS}),
    # PLANNING -> OBSERVING: an unusable turn is answered by the planner itself (a repair), not by tools.
    RunState.PLANNING: frozenset({RunState.EXECUTING, RunState.OBSERVING, RunState.SUCCEEDED, *_ENDINGS}),
    RunState.EXECUTING: frozenset(
        {RunState.OBSERVING, RunState.WAITING_APPROVAL, RunState.WAITING_CHILDREN, *_ENDINGS}
    ),
    RunState.OBSERVING: frozenset({RunState.PLANNING, *_ENDINGS}),
    RunState.WAITING_APPROVAL: frozenset({RunState.EXECUTING, RunState.OBSERVING, *_ENDINGS}),
    RunState.WAITING_CHILDREN: frozenset({RunState.OBSERVING, *_ENDINGS}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
}


def can_transition(current: RunState, target: RunState) -> bool:
    return target in TRANSITIONS[current]


def is_terminal(state: RunState | str) -> bool:
    return RunState(state) in TERMINAL
