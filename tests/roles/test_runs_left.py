"""What a process takes a run to be without reading it (``RunsLeft``): only what it knows the whole row of, at one
version. Every guess is checked by the store when used; these tests pin what is guessed at all."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from agentfleet.errors import MalformedEvent
from agentfleet.events.envelope import Envelope, EventType, RunLeft, ToolFinished
from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import ToolResult
from agentfleet.roles.runs_left import RunsLeft, left_by
from agentfleet.store.records import RunRecord
from agentfleet.store.runs import UNVERSIONED

T0 = datetime(2026, 12, 5, tzinfo=UTC)


def _run(state: RunState, version: int, iteration: int, **fields: object) -> RunRecord:
    run = RunRecord("r", "a", "g", "t", state, version, iteration, {"q": 1}, {"max_steps": 9}, 0, 0, 0, 0.0, None,
                    None, T0, T0)
    return dataclasses.replace(run, **fields)  # type: ignore[arg-type]


def test_what_a_call_carries_names_everything_written_without_a_move() -> None:
    """The observer's check of the run carried by a call covers every column written without a move: one missing here
    would be a change the check cannot see."""
    assert set(UNVERSIONED) <= set(RunLeft.model_fields)


def test_the_observer_takes_the_planners_commit_at_its_version_or_its_own_move_it_vouches_for() -> None:
    planners = _run(RunState.EXECUTING, 7, 3, steps_used=4, input_tokens=40, reserved_tokens=5,
                    updated_at=T0 + timedelta(seconds=3))
    left = left_by(planners, from_version=5)
    observers = _run(RunState.OBSERVING, 5, 2, steps_used=3, input_tokens=30)

    kept = RunsLeft()
    kept.keep(observers)
    known = kept.finished("r", left)
    assert known == dataclasses.replace(observers, state=RunState.EXECUTING, version=7, iteration=3, steps_used=4,
                                        input_tokens=40, reserved_tokens=5, updated_at=T0 + timedelta(seconds=3))
    assert kept.finished("r", left) is None, "taken: the handling that took it commits the run's next state"

    kept.keep(planners)  # one process: the planner's own commit
    assert kept.finished("r", left_by(planners)) == planners


@pytest.mark.parametrize("kept_run, from_version", [
    (_run(RunState.OBSERVING, 4, 2), 5),  # an older move of the observer's: more happened since than is carried
    (_run(RunState.OBSERVING, 5, 2), None),  # the planner vouches for nothing (it read the run at a later version)
    (_run(RunState.WAITING_APPROVAL, 5, 2), 5),  # not an observer's move: only that is vouched for
    (_run(RunState.EXECUTING, 8, 4), 5),  # newer than what the call carries
])
def test_a_run_known_at_another_version_is_not_guessed(kept_run: RunRecord, from_version: int | None) -> None:
    kept = RunsLeft()
    kept.keep(kept_run)
    assert kept.finished("r", left_by(_run(RunState.EXECUTING, 7, 3), from_version=from_version)) is None


def test_a_call_result_carrying_a_run_that_does_not_parse_is_malformed() -> None:
    finished = ToolFinished(agent="a", iteration=0, call_id="c", tool="t", sibling_call_ids=["c"],
                            result=ToolResult(ok=True), run_left=left_by(_run(RunState.EXECUTING, 2, 0)))
    wire = finished.model_dump(mode="json")
    for bad in ({"state": "SOMEWHERE"}, {"version": "two"}, {"extra": 1}, {"input_tokens": None}):
        env = Envelope.new(EventType.TOOL_COMPLETED, "r", finished, trace_id="t")
        env = env.model_copy(update={"payload": {**wire, "run_left": {**wire["run_left"], **bad}}})
        with pytest.raises(MalformedEvent):
            env.body()


def test_what_is_kept_is_bounded_by_the_inputs_bytes_as_well_as_by_count() -> None:
    """Each run kept holds its input (up to the inbox's limit, 1 MiB): the map is bounded by what those weigh, so a
    burst of runs with large inputs cannot grow a worker by thousands of them; a run heavier than the whole budget is
    not kept at all (it is read, as any run not known)."""
    kept = RunsLeft(size=100, budget=10_000)
    big = {"blob": "x" * 3_000}
    for i in range(10):
        kept.keep(dataclasses.replace(_run(RunState.EXECUTING, 1, 0), run_id=f"r{i}", input=big))
    assert kept.weight <= 10_000
    survivors = [i for i in range(10) if kept.take(f"r{i}") is not None]
    assert len(survivors) >= 2 and survivors == list(range(10 - len(survivors), 10)), "the least recently kept dropped"
    assert kept.weight == 0, "what is taken no longer counts"
    kept.keep(dataclasses.replace(_run(RunState.EXECUTING, 1, 0), input={"blob": "x" * 20_000}))
    assert kept.take("r") is None and kept.weight == 0
    kept.keep(_run(RunState.EXECUTING, 1, 0))
    kept.keep(dataclasses.replace(_run(RunState.EXECUTING, 2, 0), input={"blob": "x" * 20_000}))
    assert kept.take("r") is None, "a run kept again too heavy to keep: its older entry is gone too"


def test_a_run_copied_with_changes_is_what_dataclasses_replace_makes_and_unknown_names_are_refused() -> None:
    """``RunRecord.replace`` skips ``__init__`` (the copies of a handling were ~20 µs each): the copy must still be
    exactly the record ``dataclasses.replace`` makes, leave the original alone, and refuse a name it does not have."""
    run = _run(RunState.EXECUTING, 7, 3, steps_used=4, parent={"run_id": "p"})
    changes = {"state": RunState.OBSERVING, "version": 8, "input_tokens": 12, "updated_at": T0 + timedelta(seconds=1)}
    copied = run.replace(**changes)
    assert copied == dataclasses.replace(run, **changes)  # type: ignore[arg-type]
    assert type(copied) is RunRecord and copied is not run
    assert (run.state, run.version, run.input_tokens) == (RunState.EXECUTING, 7, 0)
    assert copied.parent is run.parent and copied.ancestors == ["p"]  # fields shared as dataclasses.replace shares them
    with pytest.raises(dataclasses.FrozenInstanceError):
        copied.version = 9  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field versoin"):
        run.replace(versoin=8)
