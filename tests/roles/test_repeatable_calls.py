"""A call of a tool that may run again with no harm (idempotent, which read-only tools are) writes nothing before it
runs, the first time it is delivered: its step is written once, finished, with the handling's commit (one round trip,
where an intent first made two; issue 23). A redelivered call, which may follow a worker the call took down, writes
its intent first as before, so the attempts that crash a worker are still counted; a call of any other tool always
does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentfleet.config.settings import get_settings
from agentfleet.roles.step import Step
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import count_round_trips, wait_for_run

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(distributed_env: dict[str, str]) -> Iterator[InProcessFleet]:
    with InProcessFleet(get_settings()) as running:
        yield running


def test_a_repeatable_call_delivered_once_is_one_round_trip_and_its_step_is_finished(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = count_round_trips(monkeypatch, "executor", "tool.requested")
    run = wait_for_run(fleet.store, fleet.submit({"agent": "stepper", "input": {}}))
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    assert sorted(counted.settled().values()) == [1, 1, 1], counted
    tools = [s for s in fleet.store.steps(run.run_id) if s["kind"] == "tool"]
    assert [(s["status"], s["attempts"], s["input"], s["output"]["output"]["text"]) for s in tools] == [
        ("succeeded", 1, {"text": f"t{i}"}, f"t{i}") for i in range(3)]
    assert all(s["worker"] and s["started_at"] <= s["finished_at"] and s["duration_ms"] >= 0 for s in tools), tools


def test_any_other_call_writes_its_intent_before_it_runs(fleet: InProcessFleet,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    counted = count_round_trips(monkeypatch, "executor", "tool.requested")
    run = wait_for_run(fleet.store, fleet.submit({"agent": "single", "input": {}}))
    assert run.result and run.result["status"] == "succeeded", run.result
    assert sorted(counted.settled().values()) == [2], counted


def test_a_redelivered_repeatable_call_writes_its_intent_first(fleet: InProcessFleet,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As if every call had been delivered before, to a worker that died: its intent goes first, and counts the
    attempt that may have died without writing one."""
    original = Step.__init__

    def redelivered(self: Step, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.role == "executor":
            self.redelivered, self.first_delivery = True, False

    monkeypatch.setattr(Step, "__init__", redelivered)
    counted = count_round_trips(monkeypatch, "executor", "tool.requested")
    run = wait_for_run(fleet.store, fleet.submit({"agent": "stepper", "input": {}}))
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    assert sorted(counted.settled().values()) == [2, 2, 2], counted
    tools = [s for s in fleet.store.steps(run.run_id) if s["kind"] == "tool"]
    # Each counted as its second attempt: a first that wrote nothing may have run, and taken its worker down.
    assert [(s["status"], s["attempts"]) for s in tools] == [("succeeded", 2)] * 3


def test_a_repeatable_call_that_may_outlast_the_sweepers_patience_writes_its_intent_first(
        distributed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """slow_echo's timeout is the fleet's default, 30 s: with the sweeper calling a run stalled after 100 s, a call
    waiting that long for a resource and then running as long again would come near it. Held, it is seen running."""
    monkeypatch.setenv("AGENTFLEET_STALL_AFTER_S", "100")
    get_settings.cache_clear()
    with InProcessFleet(get_settings()) as fleet:
        counted = count_round_trips(monkeypatch, "executor", "tool.requested")
        run = wait_for_run(fleet.store, fleet.submit({"agent": "stepper", "input": {}}))
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    assert sorted(counted.settled().values()) == [2, 2, 2], counted


def test_a_repeatable_calls_result_known_when_the_database_went_away_is_committed_not_run_again(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The call ran with nothing written, then its commit met a database gone away: its result rides in the retried
    message (written then with an intent, as any carried result is), and the tool is not run a second time."""
    from sqlalchemy.exc import OperationalError

    from agentfleet.roles import executor

    original_commit, original_attempt = Step.commit, executor._attempt
    ran: list[str] = []
    failed: list[str] = []
    carried: list[str] = []

    def attempt(step: Step, req: Any, n: int, arguments: Any) -> Any:
        ran.append(req.call.id)
        return original_attempt(step, req, n, arguments)

    def commit(self: Step, conn: Any, events: Any) -> Any:
        if self.role == "executor":
            if self.carried is not None:
                carried.append(self.env.event_id)
            elif not failed:
                failed.append(self.env.event_id)
                raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))
        return original_commit(self, conn, events)

    monkeypatch.setattr(executor, "_attempt", attempt)
    monkeypatch.setattr(Step, "commit", commit)
    run = wait_for_run(fleet.store, fleet.submit({"agent": "stepper", "input": {}}))
    assert run.result and run.result["error_code"] == "MAX_STEPS", run.result
    assert len(failed) == 1 and carried == failed, (failed, carried)
    assert len(ran) == len(set(ran)) == 3, ran  # each call ran once: the carried result was committed
    tools = [s for s in fleet.store.steps(run.run_id) if s["kind"] == "tool"]
    assert [(s["status"], s["attempts"]) for s in tools] == [("succeeded", 1)] * 3
    assert [s["output"]["output"]["text"] for s in tools] == ["t0", "t1", "t2"]
