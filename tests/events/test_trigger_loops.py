"""Trigger loops end with a code (issue "Containment", case 15): an agent triggered by the event its own tool
publishes, and two agents triggering each other, stop at the chain's depth; the bound is also the trace's run
budget. A fleet of its own (tighter bounds), in a module of its own: two embedded fleets in one process share
the in-memory broker's queues."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentfleet.loop.states import RunState
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("bounded"), "tests.fixtures.agents",
                        AGENTFLEET_TRIGGER_MAX_DEPTH="4", AGENTFLEET_TRACE_MAX_RUNS="9") as running:
        yield running


def _settled(fleet: EmbeddedFleet, agents: set[str], quiet_s: float = 3.0, timeout: float = 90) -> list:
    """The runs of ``agents`` once no new one has started for ``quiet_s`` and all have ended."""
    seen, since = -1, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for a in agents for r in fleet.store.list_runs(agent=a)]
        if len(runs) != seen:
            seen, since = len(runs), time.monotonic()
        elif time.monotonic() - since > quiet_s and all(r.state in (RunState.SUCCEEDED, RunState.FAILED)
                                                          for r in runs):
            return runs
        time.sleep(0.1)
    raise AssertionError(f"{agents} did not settle: {seen} runs and counting")


def _kick(fleet: EmbeddedFleet, name: str, payload: dict) -> None:
    from agentfleet.events.domain import external_event

    fleet.runtime.publisher.publish([external_event(name, f"kick-{name}-{time.monotonic_ns()}", payload)])


def test_an_agent_triggered_by_its_own_event_stops_at_the_chain_depth(
        bounded: EmbeddedFleet, caplog: pytest.LogCaptureFixture) -> None:
    """Was: a run every 1.2 s, forever (57 runs in 70 s)."""
    with caplog.at_level("WARNING", logger="agentfleet.events.publisher"):
        _kick(bounded, "loop.ping", {"n": 0})
        runs = _settled(bounded, {"echo_ping"})
    assert sorted(r.cause["generation"] for r in runs) == [1, 2, 3, 4]  # type: ignore[index]
    assert len({r.trace_id for r in runs}) == 1  # one causal chain, one trace
    stopped = [r for r in caplog.records if getattr(r, "error_code", None) == "TRIGGER_LOOP"]
    assert len(stopped) == 1 and "generation 5" in stopped[0].reason  # type: ignore[attr-defined]


def test_two_agents_triggering_each_other_stop_at_the_traces_run_budget_or_depth(bounded: EmbeddedFleet) -> None:
    _kick(bounded, "loop.a", {})
    runs = _settled(bounded, {"ping_a", "ping_b"})
    assert [r.agent for r in sorted(runs, key=lambda r: r.cause["generation"])] == [  # type: ignore[index]
        "ping_a", "ping_b", "ping_a", "ping_b"]


def test_the_chain_bound_is_the_depth_and_the_traces_run_budget() -> None:
    from agentfleet.events.domain import chain_bound, generation_of

    assert chain_bound(4, 3, 1, max_depth=4, max_runs=9) is None
    assert "past trigger_max_depth=4" in (chain_bound(5, 3, 1, max_depth=4, max_runs=9) or "")
    assert "would pass trace_max_runs=9" in (chain_bound(2, 8, 2, max_depth=4, max_runs=9) or "")  # a fan-out
    assert generation_of(None) == 0 and generation_of({"generation": 3}) == 3
    assert generation_of({"event": "x"}) == 1  # a run triggered before generations were recorded
    assert generation_of({"generation": "9"}) == 1 and generation_of({"generation": -2}) == 1  # stored rows are input


def test_cancelling_a_run_cancels_the_runs_its_events_triggered(bounded: EmbeddedFleet) -> None:
    """DESIGN §13: a cancel reaches everything under the run, triggered runs included."""
    from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
    from tests.helpers import eventually, wait_for_run

    herald_id = bounded.submit({"agent": "herald", "input": {}})
    listener = eventually(lambda: next((r for r in bounded.store.list_runs(agent="long_listener")
                                        if (r.cause or {}).get("run_id") == herald_id), None), timeout=30)
    bounded.runtime.publisher.publish([Envelope.new(EventType.RUN_CANCEL_REQUESTED, herald_id,
                                                    RunCancelRequested(reason="not now"), trace_id="t")])
    assert wait_for_run(bounded.store, herald_id).state == RunState.CANCELLED
    ended = wait_for_run(bounded.store, listener.run_id, timeout=30)
    assert ended.state == RunState.CANCELLED and "whose event started it was stopped" in ended.result["message"]  # type: ignore[index]


def test_a_triggered_goal_still_queued_when_its_cause_was_cancelled_never_takes_a_turn(bounded: EmbeddedFleet) -> None:
    from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted, RunCancelRequested
    from agentfleet.loop.keys import run_id_for
    from tests.helpers import eventually, wait_for_run

    herald_id = bounded.submit({"agent": "herald", "input": {}})
    eventually(lambda: bounded.store.get_run(herald_id), timeout=30)
    bounded.runtime.publisher.publish([Envelope.new(EventType.RUN_CANCEL_REQUESTED, herald_id,
                                                    RunCancelRequested(reason="not now"), trace_id="t")])
    herald = wait_for_run(bounded.store, herald_id)
    late = f"trigger/late-{time.monotonic_ns()}/long_listener"
    bounded.runtime.publisher.publish([Envelope.new(EventType.GOAL_SUBMITTED, run_id_for("long_listener", late),
                                                    GoalSubmitted(agent="long_listener", goal_id=late, input={},
                                                                  cause={"event": "loop.long", "event_id": "x",
                                                                         "source": "run", "run_id": herald_id,
                                                                         "generation": 1}),
                                                    trace_id=herald.trace_id)])
    run = wait_for_run(bounded.store, run_id_for("long_listener", late))
    assert run.state == RunState.CANCELLED and run.steps_used == 0, run.result
