"""Domain events on the embedded fleet: published by a tool after its step commits, recorded, and the runs
their triggers start (one per event and agent)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentfleet.events.domain import trigger_goal_id
from agentfleet.events.envelope import Envelope
from agentfleet.loop.keys import run_id_for
from agentfleet.loop.states import RunState
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, eventually, wait_for_run


@pytest.fixture(scope="module")  # one fleet for the module: its warm shutdown takes seconds
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    tmp_path = tmp_path_factory.mktemp("fleet")
    with embedded_fleet(tmp_path, "tests.fixtures.agents") as running:
        yield running


def test_a_tools_event_starts_the_agent_its_trigger_names_with_the_mapped_input(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "triager",
                                                  "input": {"ticket": "T-1", "priority": "high"}}))
    assert run.state == RunState.SUCCEEDED, run.result
    [recorded] = eventually(lambda: fleet.store.domain_events(run_id=run.run_id), timeout=10)
    assert (recorded["name"], recorded["payload"], recorded["source"]) == (
        "case.triaged", {"ticket": "T-1", "priority": "high"}, "run")
    started = run_id_for("on_triage", trigger_goal_id(recorded["event_id"], "on_triage"))
    triggered = wait_for_run(fleet.store, eventually(lambda: fleet.store.get_run(started) and started, timeout=10))
    assert triggered.state == RunState.SUCCEEDED and triggered.input == {"ticket": "T-1", "priority": "high"}
    assert triggered.cause == {"event": "case.triaged", "event_id": recorded["event_id"], "source": "run",
                               "run_id": run.run_id, "generation": 1}
    assert triggered.trace_id == run.trace_id  # one trace across agents
    # A trigger whose mapped input breaks its agent's goal schema starts nothing (dead-lettered instead).
    assert fleet.store.get_run(run_id_for("strict_on_triage",
                                          trigger_goal_id(recorded["event_id"], "strict_on_triage"))) is None


def test_an_event_delivered_again_starts_no_second_run(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "triager", "input": {"ticket": "T-2", "priority": "low"}}))
    [sent] = eventually(lambda: [e for e in fleet.store.stored_events(run.run_id) if e["type"] == "domain.event"],
                        timeout=10)
    fleet.runtime.publisher.publish([Envelope.model_validate({**sent, "event_id": "another-copy"})])
    time.sleep(1.0)
    runs = [r for r in fleet.store.list_runs(agent="on_triage")
            if r.input == {"ticket": "T-2", "priority": "low"}]
    assert len(runs) == 1


def test_an_event_breaking_its_schema_is_refused_and_the_tool_gets_invalid_arguments(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "triager",
                                                  "input": {"ticket": "T-3", "priority": "urgent"}}))
    seen = run.result["output"]["seen"]  # type: ignore[index]
    assert seen[0]["error_code"] == "INVALID_ARGUMENTS" and "priority" in seen[0]["message"]
    assert fleet.store.domain_events(run_id=run.run_id) == []


def test_a_sandboxed_tools_events_come_back_through_its_events_file_and_trigger_runs(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "shipper", "input": {"parcels": ["P-1", "P-2"]}}))
    assert run.state == RunState.SUCCEEDED and run.result["output"]["seen"][0]["ok"], run.result  # type: ignore[index]
    recorded = eventually(lambda: (found := fleet.store.domain_events(run_id=run.run_id)) and len(found) == 2
                          and found, timeout=10)
    assert sorted(e["payload"]["parcel"] for e in recorded) == ["P-1", "P-2"]
    started = [run_id_for("on_shipped", trigger_goal_id(e["event_id"], "on_shipped")) for e in recorded]
    ended = [wait_for_run(fleet.store, eventually(lambda r=r: fleet.store.get_run(r) and r, timeout=10))
             for r in started]
    assert sorted(r.input["parcel"] for r in ended) == ["P-1", "P-2"]
    assert all(r.state == RunState.SUCCEEDED and r.trace_id == run.trace_id for r in ended)


def test_a_call_that_fails_after_publishing_sends_none_of_its_events(fleet: EmbeddedFleet) -> None:
    """Events are part of the call's outcome, as in the outbox of a transaction: a failed call has none."""
    run = wait_for_run(fleet.store, fleet.submit({"agent": "hasty_triager",
                                                  "input": {"ticket": "T-9", "priority": "high"}}))
    assert run.state == RunState.SUCCEEDED and run.result["output"]["seen"][0]["ok"] is False  # type: ignore[index]
    time.sleep(0.5)
    assert fleet.store.domain_events(run_id=run.run_id) == []
    assert [r for r in fleet.store.list_runs(agent="on_triage") if r.input == {"ticket": "T-9", "priority": "high"}
            ] == []


# -- trigger loops (Containment 15) -------------------------------------------------------------------------

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
