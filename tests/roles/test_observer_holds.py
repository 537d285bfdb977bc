"""The observer holds a run as the planner's commit that sent the call out left it, carried by the call's result,
instead of reading it: the iteration's one call then fans in, and the run moves on, in one round trip (issue 23). A
guess that is wrong (the run changed since, a result already there) fails that transaction whole, and the observer
reads as it always did."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentfleet.config.settings import get_settings
from agentfleet.hooks.base import current_step
from agentfleet.loop.budgets import Reservation
from agentfleet.roles.runs_left import RunsLeft
from agentfleet.store.runs import Runs
from agentfleet.store.transcript import Transcripts
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import count_round_trips, wait_for_run

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(distributed_env: dict[str, str]) -> Iterator[InProcessFleet]:
    with InProcessFleet(get_settings()) as running:
        yield running


class _MapPerRole:
    """The runs each role's process knows, as if planner and observer ran in processes of their own (a fleet's
    workers), where this embedded fleet's roles share one process and one map."""

    def __init__(self) -> None:
        self.maps: defaultdict[str, RunsLeft] = defaultdict(RunsLeft)

    def __getattr__(self, name: str) -> Any:
        step = current_step()
        assert step is not None, "the runs left are a handling's"
        return getattr(self.maps[step.role], name)


def _ended_at_max_steps(fleet: InProcessFleet) -> Any:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "stepper", "input": {}}))
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    return run


@pytest.mark.parametrize("map_per_role, round_trips", [(False, [1, 1, 1]), (True, [1, 1, 2])],
                         ids=["one-process", "a-process-per-role"])
def test_a_lone_calls_result_fans_in_on_the_run_as_known_in_one_round_trip(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch, map_per_role: bool, round_trips: list[int]) -> None:
    """One process (this fleet): the observer takes the run as the planner's commit left it, every iteration. Planner
    and observer in processes of their own: the observer knows the run from its own move of the iteration before,
    moved on as the planner's commit vouches (``RunLeft.from_version``); the first iteration is read."""
    if map_per_role:
        monkeypatch.setattr(fleet.runtime, "runs_left", _MapPerRole())
    counted = count_round_trips(monkeypatch, "observer", "tool.completed", "tool.failed")
    run = _ended_at_max_steps(fleet)
    assert sorted(counted.settled().values()) == round_trips, counted
    assert run.steps_used == 3


def test_a_run_changed_since_the_planners_commit_is_read_and_fanned_in_as_it_is(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child's turn reserves its estimate in the run (no move) after the planner's commit and before its call's
    result is fanned in: the hold of the run as carried fails whole, the observer reads it, and nothing held is lost:
    every reservation is in the run as it ends."""
    original, held = Runs.hold_run, []
    child = Reservation(tokens=1000, cost_usd=0.25, steps=1)

    def changed_first(self: Runs, conn: Any, run: Any) -> Any:
        step = current_step()
        if step is not None and step.role == "observer":
            def reserve() -> None:  # by another worker
                with fleet.store.tx() as other:
                    fleet.store.reserve(other, [run.run_id], child)

            with ThreadPoolExecutor(1) as elsewhere:
                elsewhere.submit(reserve).result()
            held.append(child)
        return original(self, conn, run)

    monkeypatch.setattr(Runs, "hold_run", changed_first)
    counted = count_round_trips(monkeypatch, "observer", "tool.completed", "tool.failed")
    run = _ended_at_max_steps(fleet)
    assert len(held) == len(counted.settled()) == 3, "each result found the run changed since the planner's commit"
    assert (run.reserved_tokens, run.reserved_steps) == (3 * child.tokens, 3 * child.steps)
    assert run.reserved_cost_usd == pytest.approx(3 * child.cost_usd)
    # The failed hold's round trip (its COMMIT) and its ROLLBACK, then as a read run costs.
    assert sorted(counted.settled().values()) == [2 + 2] * 3, counted


def test_a_result_recorded_already_is_the_one_fanned_in(fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The call's result is there before the observer's (a result no commit of this fleet can leave while the run
    still executes: written here by hand). The observer's guess that its own is the first fails whole; it reads, and
    the result recorded is the one the model is shown, the same in the transcript as in the results kept."""
    original, planted = Transcripts.record_first_observation, []

    def recorded_before(self: Transcripts, conn: Any, **fields: Any) -> None:
        earlier = {"ok": True, "output": {"planted": len(planted)}}
        with fleet.store.tx() as other:
            assert fleet.store.record_observation(other, **{**fields, "result": earlier})
        planted.append(earlier)
        original(self, conn, **fields)

    monkeypatch.setattr(Transcripts, "record_first_observation", recorded_before)
    run = _ended_at_max_steps(fleet)
    assert len(planted) == 3
    tools = [m for m in fleet.store.transcript(run.run_id) if m.role == "tool"]
    assert [json.loads(m.content or "")["output"] for m in tools] == [{"planted": i} for i in range(3)]
