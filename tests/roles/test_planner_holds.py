"""What the planner holds while it waits on something slow: a Redis that hangs (the gate's read of its tools'
health) must not hold the run's row, so a cancel, the sweeper or an approval answer does not wait behind it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from agentfleet.config.settings import get_settings
from agentfleet.fleet.dispatch import ToolDispatch
from agentfleet.store.base import NOT_DURABLE
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import count_round_trips, wait_for_run

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(distributed_env: dict[str, str]) -> Iterator[InProcessFleet]:
    with InProcessFleet(get_settings()) as running:
        yield running


def test_a_slow_gate_read_does_not_hold_the_runs_row(fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    inside, release = threading.Event(), threading.Event()
    original = ToolDispatch.offer

    def slow_offer(self: ToolDispatch, tools: Any, elsewhere: Any = None) -> Any:  # Redis answering slowly
        inside.set()
        release.wait(20)
        return original(self, tools, elsewhere)

    monkeypatch.setattr(ToolDispatch, "offer", slow_offer)
    run_id = fleet.submit({"agent": "single", "input": {}})
    try:
        assert inside.wait(20), "the planner never asked for its tools' health"
        with fleet.store.engine.connect() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '1s'"))
            try:  # what a cancel or the sweeper does first: take the run's row
                conn.execute(text("SELECT 1 FROM runs WHERE run_id = :r FOR UPDATE"), {"r": run_id}).all()
            except OperationalError as exc:
                pytest.fail(f"the run's row was held while the planner waited on Redis: {exc}")
            conn.rollback()
    finally:
        release.set()
    run = wait_for_run(fleet.store, run_id)
    assert run.result and run.result["status"] == "succeeded", run.result


def test_a_run_whose_spend_changes_during_its_model_call_commits_its_turns_on_the_figures_then(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner commits a turn holding the run as it read it before the model call, unless the run changed in
    between: here a child's turn is counted in it (a spend, no move) during every call. Each turn is then committed on
    the figures as they are, not as they were read: nothing counted is lost, and none counted twice."""
    from agentfleet.loop.transcript import Usage
    from agentfleet.roles import planner

    original, calls = planner._complete, []
    child = Usage(input_tokens=1000, output_tokens=10, cost_usd=0.25)

    def spent_meanwhile(hooks: Any, agent: Any, request: Any, policy: Any, *more: Any) -> Any:
        turn = original(hooks, agent, request, policy, *more)
        with fleet.store.tx() as conn:
            fleet.store.add_spend(conn, [request.run_id], child)
        calls.append(turn)
        return turn

    monkeypatch.setattr(planner, "_complete", spent_meanwhile)
    run_id = fleet.submit({"agent": "single", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert run.result and run.result["status"] == "succeeded", run.result
    assert len(calls) >= 2, "a tool call, then the answer"
    assert run.steps_used == 2 * len(calls)
    assert run.input_tokens == sum(t.usage.input_tokens for t in calls) + len(calls) * child.input_tokens
    assert run.output_tokens == sum(t.usage.output_tokens for t in calls) + len(calls) * child.output_tokens
    assert run.result["usage"]["input_tokens"] == run.input_tokens


def test_a_run_changed_during_a_call_made_first_is_read_and_the_turn_committed_on_it(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The run changed while the model, asked first, was thinking (a child's spend, no move): the commit holding it as
    known fails whole, and the planner reads it and commits the same turn on it, the usual way. The model is asked once
    an iteration; nothing counted is lost or counted twice."""
    from agentfleet.loop.transcript import Usage
    from agentfleet.roles import planner

    original, calls = planner._complete, []
    child = Usage(input_tokens=1000, output_tokens=10, cost_usd=0.25)

    def spent_meanwhile(hooks: Any, agent: Any, request: Any, policy: Any, *more: Any) -> Any:
        turn = original(hooks, agent, request, policy, *more)
        if request.iteration > 0:
            with fleet.store.tx() as conn:
                fleet.store.add_spend(conn, [request.run_id], child)
        calls.append(turn)
        return turn

    monkeypatch.setattr(planner, "_complete", spent_meanwhile)
    caplog.set_level("INFO", logger="agentfleet.roles.planner")
    run_id = fleet.submit({"agent": "stepper", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan" and s["status"] == "succeeded"]
    assert len(calls) == len(plans) >= 2, "one call an iteration: a turn is carried, never asked for again"
    assert [s["attempts"] for s in plans] == [1] * len(plans), plans
    carried = [r for r in caplog.records if "the turn committed on it" in r.getMessage()]
    assert len(carried) == len(calls) - 1, "each call after the first was made first, and its commit found the change"
    assert run.input_tokens == sum(t.usage.input_tokens for t in calls) + (len(calls) - 1) * child.input_tokens
    with fleet.store.engine.connect() as conn:
        assert not conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")).scalar()


@pytest.mark.parametrize(("longest_call_s", "trips"), [(0.0, 1), (None, 2)], ids=["model-first", "step-held"])
def test_a_planner_takes_the_run_as_its_last_commit_left_it_without_reading_it(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch, longest_call_s: float | None, trips: int) -> None:
    """After the first iteration the planner knows the run: its own last commit sent it to its tools, and the observer's
    move to OBSERVING is all that came after.

    model-first: it knows the transcript too, through the turn it committed, and its model says a call is short. On a
    first delivery it asks the model before writing anything, then holds the run as known, moves it on, and commits the
    plan step whole with the decision: one round trip an iteration, the one the step budget ends included.

    step-held: a model that cannot say how long a call takes is asked with the plan step held. The planner holds the run
    as known, with the step's lock, in its first transaction's COMMIT: two round trips for an iteration (three when it
    read the run first); as many for the iteration the step budget ends (its end and, the lock's answer not known
    before that COMMIT, the lock let go).

    Either way the plan steps are there, finished, with what the model was offered, and every move is said. The turns
    are kept in the process only where the model may be asked first: elsewhere they would only weigh."""
    from tests.fixtures.agents import stepper

    monkeypatch.setattr(stepper.model, "longest_call_s", longest_call_s)
    counted = count_round_trips(monkeypatch, "planner", "observation.recorded")
    kept: list[int] = []
    keep_planned = fleet.store.keep_planned
    monkeypatch.setattr(fleet.store, "keep_planned", lambda run_id, iteration, *more: (
        kept.append(iteration), keep_planned(run_id, iteration, *more)))
    run_id = fleet.submit({"agent": "stepper", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    assert sorted(counted.settled().values()) == [trips] * 3, counted
    assert run.steps_used == 3
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    assert [(s["iteration"], s["status"], s["attempts"]) for s in plans] == [(i, "succeeded", 1) for i in range(3)]
    assert all(s["input"]["tools"] == ["slow_echo"] and s["finished_at"] for s in plans), plans
    audit = [(a["from_state"], a["to_state"]) for a in fleet.store.audit_trail(run_id)]
    assert audit.count(("OBSERVING", "PLANNING")) == 3, audit  # each move said, as before
    assert kept == ([0, 1, 2] if trips == 1 else []), kept  # the last plan ends the run: its turn is not kept


def test_a_run_changed_since_the_planners_last_commit_is_read_and_planned_on_as_it_is(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run changed between the observer's move and the planner's handling (a child's spend, no move): the hold
    of the run as the planner took it fails whole, and the planner reads it and goes on from what it is. Nothing
    counted is lost or counted twice, and no step is left held."""
    from agentfleet.loop.states import RunState
    from agentfleet.loop.transcript import Usage
    from agentfleet.store.runs import Runs
    from tests.fixtures.agents import stepper

    monkeypatch.setattr(stepper.model, "longest_call_s", None)  # the plan step held during the call
    original, spent = Runs.hold_and_lock, []
    child = Usage(input_tokens=1000, output_tokens=10, cost_usd=0.25)

    def changed_first(self: Runs, conn: Any, run: Any, hold: Any) -> bool:
        def spend() -> None:  # a child's turn, counted by another worker
            with fleet.store.tx() as other:
                fleet.store.add_spend(other, [run.run_id], child)

        if run.state == RunState.OBSERVING:  # a plan after an observer's move (a new run's first plan holds it too)
            with ThreadPoolExecutor(1) as elsewhere:
                elsewhere.submit(spend).result()
            spent.append(child)
        return original(self, conn, run, hold)

    monkeypatch.setattr(Runs, "hold_and_lock", changed_first)
    counted = count_round_trips(monkeypatch, "planner", "observation.recorded")
    run_id = fleet.submit({"agent": "stepper", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    assert len(spent) == len(counted.settled()) == 2, \
        "each iteration after the first took the run as left, found it changed"
    assert run.input_tokens == len(spent) * child.input_tokens + sum(
        s["output"]["usage"]["input_tokens"] for s in fleet.store.steps(run_id)
        if s["kind"] == "plan" and s["status"] == "succeeded")
    # As a read run costs (three round trips for an iteration, two for the one ended by the step budget), and the
    # failed hold's round trip and its ROLLBACK.
    assert sorted(counted.settled().values()) == [2 + 2, 3 + 2], counted


@pytest.mark.parametrize(("agent", "error_code", "entries", "repairs"), [
    ("late_garbled", None, ["first", "fine"], 2), ("late_overspender", "TOKEN_BUDGET", ["first"], 0)])
def test_hostile_turns_of_a_model_asked_first_are_told_back_or_end_the_run_with_nothing_run(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, agent: str, error_code: str | None,
        entries: list[str], repairs: int) -> None:
    """Model output is input on the one-transaction path too: a turn the store cannot hold (a NUL in a call id, NaN in
    the arguments) is told back in the same single commit, and an enormous one (400 KB, under-reported as 10 tokens)
    ends the run on its budget before any of its calls runs. Every plan after the first is made first, in one round
    trip."""
    counted = count_round_trips(monkeypatch, "planner", "observation.recorded")
    run_id = fleet.submit({"agent": agent, "input": {}})
    run = wait_for_run(fleet.store, run_id, timeout=60)
    assert run.result is not None, run
    if error_code is None:
        assert run.result["status"] == "succeeded", run.result
    else:
        assert run.result["error_code"] == error_code and "none of its calls was run" in run.result["message"]
    ledger = (tmp_path / f"ledger-{run_id}.txt").read_text().splitlines()
    assert [line.split(":")[1] for line in ledger] == entries
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    assert sum(bool(s["output"].get("repair")) for s in plans) == repairs, plans
    assert set(counted.settled().values()) == {1}, counted


def test_a_new_runs_first_plan_holds_the_run_as_its_start_left_it(fleet: InProcessFleet,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A goal's handling starts its run (the insert, then the move to PLANNING with the COMMIT: two round trips) and
    plans its first iteration. The planner knows the run then, as its own commit left it: the plan's first
    transaction holds the row as that, with the step's lock, in the round trip of its COMMIT, and does not read it
    first. Four round trips, not five; the run goes on as before, every move said."""
    counted = count_round_trips(monkeypatch, "planner", "goal.submitted")
    run_id = fleet.submit({"agent": "single", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert run.result and run.result["status"] == "succeeded", run.result
    assert list(counted.settled().values()) == [4], counted
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    assert [(s["iteration"], s["status"], s["attempts"]) for s in plans] == [(0, "succeeded", 1),
                                                                              (1, "succeeded", 1)], plans
    audit = [(a["from_state"], a["to_state"]) for a in fleet.store.audit_trail(run_id)]
    assert audit == [("PENDING", "PLANNING"), ("PLANNING", "EXECUTING"), ("EXECUTING", "OBSERVING"),
                     ("OBSERVING", "PLANNING"), ("PLANNING", "SUCCEEDED")], audit


def test_a_new_runs_start_waits_for_the_disk_only_where_its_handling_ends(fleet: InProcessFleet,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A goal's handling that goes on to plan commits the run's start without waiting for the disk: the goal's message
    is acked only after the plan's COMMIT, which waits, and the WAL being one sequence, takes the start to the disk with
    it; a database crash before it loses a start that the goal, delivered again, makes again (``Store.relax``). A
    handling that ends with the start (its run waits for its thread's turn) waits for the disk, as does every plan's
    last COMMIT."""
    counted = count_round_trips(monkeypatch, "planner", "goal.submitted")
    thread = f"t-{uuid.uuid4().hex[:8]}"
    first = fleet.submit({"agent": "turn_taker", "input": {"n": 0}, "thread_id": thread})
    second = fleet.submit({"agent": "turn_taker", "input": {"n": 1}, "thread_id": thread})
    for run_id in (first, second):
        run = wait_for_run(fleet.store, run_id)
        assert run.result and run.result["status"] == "succeeded", run.result
    counted.settled(handlings=3)
    handlings = list(counted.sent.values())  # in the order handled: the first goal, the second's wait, its turn
    assert len(handlings) == 3, handlings

    def relaxed(trip: list[str]) -> bool:
        return NOT_DURABLE in trip

    started, waited, turn = handlings
    assert [relaxed(t) for t in started] == [False, True, True, False], started  # insert; start, intent; the plan
    assert started[-1][-1] == "COMMIT" and started[1][-1] == "COMMIT"
    assert [relaxed(t) for t in waited] == [False, False], waited  # ends with the start: durable
    assert not relaxed(turn[-1]), turn


def test_a_new_run_moved_before_its_first_plan_is_read_and_planned_as_it_is(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Between the start's COMMIT and the first plan's transaction the run changed (a spend counted in it, no move):
    the hold of the run as started fails whole, and the planner reads it and plans on it. Nothing is lost or counted
    twice, and the step is not left held."""
    from agentfleet.loop.transcript import Usage
    from agentfleet.roles import planner

    child = Usage(input_tokens=1000, output_tokens=10, cost_usd=0.25)
    original, spent = planner._plan, []

    def spend_first(step: Any, agent: Any, iteration: int, *args: Any, **kwargs: Any) -> Any:
        if iteration == 0 and not spent:
            with fleet.store.tx() as conn:
                fleet.store.add_spend(conn, [step.env.run_id], child)
            spent.append(step.env.run_id)
        return original(step, agent, iteration, *args, **kwargs)

    monkeypatch.setattr(planner, "_plan", spend_first)
    caplog.set_level("INFO", logger=planner.__name__)
    run_id = fleet.submit({"agent": "single", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert spent == [run_id]
    assert any(r.getMessage() == "run not as this planner left it: read" and getattr(r, "run_id", None) == run_id
               for r in caplog.records), "the hold of the run as started failed, and the run was read"
    assert run.result and run.result["status"] == "succeeded", run.result
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    assert all(s["status"] == "succeeded" and s["attempts"] == 1 for s in plans), plans
    assert run.input_tokens >= child.input_tokens and run.cost_usd >= child.cost_usd
    with fleet.store.engine.connect() as conn:  # no step lock left held by the planner's connections
        held = conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                                 "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar_one()
    assert held == 0
