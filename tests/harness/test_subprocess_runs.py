"""Subprocess tools inside runs on the embedded fleet: artifacts kept and read, cancellation reaching tools."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.loop.states import RunState
from agentfleet.sandbox.bwrap import support
from agentfleet.workers.embedded import EmbeddedFleet
from tests.fixtures.agents import NAP_MARKER
from tests.helpers import embedded_fleet, eventually, processes_with, wait_for_run


@pytest.fixture(scope="module")  # one fleet for the module: its warm shutdown takes seconds
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    tmp_path = tmp_path_factory.mktemp("fleet")
    assert support(refresh=True).available, support().detail
    with embedded_fleet(tmp_path, "tests.fixtures.agents,agentfleet.examples.polyglot") as running:
        yield running


def cancel(fleet: EmbeddedFleet, run_id: str) -> None:
    fleet.runtime.publisher.publish([Envelope.new(EventType.RUN_CANCEL_REQUESTED, run_id,
                                                  RunCancelRequested(reason="test"), trace_id="t")])


def test_tools_in_three_languages_agree_and_a_large_answer_is_an_artifact_the_model_reads(
        fleet: EmbeddedFleet) -> None:
    text = " ".join(f"word{i}" for i in range(300))
    run = wait_for_run(fleet.store, fleet.submit({"agent": "polyglot", "input": {"text": text}}))
    assert run.state == RunState.SUCCEEDED, run.result
    out = run.result["output"]  # type: ignore[index]
    assert out["counts"] == {"python": 300, "node": 300, "bash": 300} and out["agree"]
    assert out["index_start"].startswith('{"words": [{"at": 0, "word": "word0"}')
    [kept] = fleet.store.artifacts_of(run.run_id)
    assert (kept["ref"], kept["kind"], kept["tool"]) == (out["index_artifact"], "output", "word_index")
    content = fleet.store.artifact_of_run(run.run_id, kept["ref"])
    assert content is not None and len(json.loads(content)["words"]) == 300 and len(content) == out["index_size"]
    # The same text in another run: the content is stored once; each run sees only its own artifacts.
    other = wait_for_run(fleet.store, fleet.submit({"agent": "polyglot", "input": {"text": text + " more"}}))
    assert fleet.store.artifact_of_run(other.run_id, kept["ref"]) is None


def test_a_cancelled_run_leaves_no_tool_process_behind(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "napper", "input": {"seconds": 90}})
    eventually(lambda: processes_with(NAP_MARKER), timeout=30, message="the nap never started")
    started = time.monotonic()
    cancel(fleet, run_id)
    assert wait_for_run(fleet.store, run_id).state == RunState.CANCELLED
    eventually(lambda: not processes_with(NAP_MARKER), timeout=10, message="the tool outlived its run")
    assert time.monotonic() - started < 30  # stopped, not waited out (its timeout is 120 s)
    step = eventually(lambda: [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"
                               and s["status"] != "started"], timeout=10)
    assert step[0]["output"]["error_code"] == "CANCELLED"


def test_a_long_python_tool_heartbeats_and_stops_when_its_run_is_cancelled(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "counter", "input": {"upto": 100000}})
    key = eventually(lambda: next((s["idempotency_key"] for s in fleet.store.steps(run_id)
                                   if s["kind"] == "tool"), None), timeout=30)
    beat = eventually(lambda: fleet.runtime.stops.last_heartbeat(key), timeout=10)
    assert "counted" in beat["details"]
    cancel(fleet, run_id)
    assert wait_for_run(fleet.store, run_id).state == RunState.CANCELLED
    done = eventually(lambda: [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"
                               and s["status"] != "started"], timeout=10)
    assert done[0]["output"]["error_code"] == "CANCELLED"


@pytest.mark.parametrize("agent, goal", [("napper", {"seconds": 25}), ("counter", {"upto": 100000})])
def test_a_deadline_stops_a_running_tool_as_a_cancel_does(fleet: EmbeddedFleet, agent: str, goal: dict) -> None:
    """Containment 12: a 25 s tool under deadline_s=3 answered after 26 s, heartbeat or not."""
    run_id = fleet.submit({"agent": agent, "input": goal, "limits": {"deadline_s": 3}})
    run = wait_for_run(fleet.store, run_id, timeout=30)
    assert run.result is not None and run.result["error_code"] == "DEADLINE", run.result
    step = eventually(lambda: [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"
                               and s["status"] != "started"], timeout=10)
    assert step[0]["output"]["error_code"] == "DEADLINE", step[0]["output"]
    eventually(lambda: not processes_with(NAP_MARKER), timeout=10, message="the tool outlived its run's deadline")


def test_a_call_that_reaches_the_executor_after_its_runs_deadline_is_not_started(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An approved call sent on after the deadline, or one that waited in the queue past it."""
    import fakeredis

    from agentfleet import ToolContext, tool
    from agentfleet.config.settings import Settings
    from agentfleet.fleet.dispatch import ToolDispatch
    from agentfleet.fleet.fleet_redis import FleetRedis

    entered: list[int] = []

    @tool
    def pay_now() -> dict:
        """Pay."""
        entered.append(1)
        return {}

    d = ToolDispatch(FleetRedis(fakeredis.FakeRedis(decode_responses=True), "t", secret=b"k"),
                     Settings(profile="embedded"), by="e", report=lambda t: None)
    late = ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=tmp_path, deadline_at=time.time() - 1)
    result = d.call(pay_now, {}, late)
    assert result.error_code == "DEADLINE" and entered == []
