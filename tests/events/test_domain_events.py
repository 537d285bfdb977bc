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


def test_an_event_id_that_races_past_the_inbox_with_another_payload_is_dead_lettered(
        fleet: EmbeddedFleet, caplog: pytest.LogCaptureFixture) -> None:
    """Containment 17, the observer's side: two copies of one event id, different bodies, both admitted before
    either was recorded. The second is kept with EVENT_CONFLICT, never dropped in silence, and starts nothing."""
    from agentfleet.events.domain import external_event

    event_id = f"race-{time.monotonic_ns()}"
    with caplog.at_level("WARNING", logger="agentfleet.events.publisher"):
        fleet.runtime.publisher.publish([external_event("case.triaged", event_id, {"ticket": "R-1",
                                                                                    "priority": "low"})])
        eventually(lambda: fleet.store.domain_event(event_id), timeout=10)
        fleet.runtime.publisher.publish([external_event("case.triaged", event_id, {"ticket": "R-1",
                                                                                    "priority": "high"})])
        eventually(lambda: [r for r in caplog.records if getattr(r, "error_code", None) == "EVENT_CONFLICT"],
                   timeout=10, message="the conflicting copy was dropped without a dead letter")
    assert fleet.store.domain_event(event_id)["payload"] == {"ticket": "R-1", "priority": "low"}  # type: ignore[index]
