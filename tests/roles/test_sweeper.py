"""The sweeper: a run whose next event was lost, or whose holder's lock outlived its message, still finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agentfleet import constants as C
from agentfleet.loop.keys import idempotency_key, run_id_for
from agentfleet.loop.states import RunState
from agentfleet.store import Store
from tests.conftest import ROOT, WorkerProcs
from tests.helpers import AmqpClient, step_held

pytestmark = pytest.mark.integration


def _until(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_a_run_whose_tool_request_was_lost_is_found_and_re_driven(
    workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path
) -> None:
    workers.env.update(AGENTFLEET_STALL_AFTER_S="1", AGENTFLEET_SWEEP_INTERVAL_S="0")  # swept by hand below
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.wait_ready()
    client = AmqpClient()
    goal_id = f"lost-{uuid.uuid4().hex}"
    run_id = run_id_for("single", goal_id)
    corr = client.publish_goal(namespace, "goal.single", {"agent": "single", "input": {}, "goal_id": goal_id})
    queue = f"{namespace}.executor"
    _until(lambda: client.channel.queue_declare(queue, passive=True).method.message_count == 1)
    time.sleep(1.5)
    env = {k: v for k, v in workers.env.items() if k.startswith("AGENTFLEET_") or k == "PYTHONPATH"}
    waiting = json.loads(_cli(env, "sweep", "--dry-run", "--json").stdout)
    assert [f for f in waiting if f["run_id"] == run_id] == []  # its request waits in line: not stalled
    client.channel.queue_purge(queue)  # the committed step's publish, lost
    status = json.loads(_cli(env, "status", run_id, "--json").stdout)
    assert status["state"] == RunState.EXECUTING and status["stuck"]["action"] == "republish"
    dry = json.loads(_cli(env, "sweep", "--dry-run", "--json").stdout)  # the session's database has other runs
    assert [(f["action"], f["events"]) for f in dry if f["run_id"] == run_id] == [("republish", 1)]
    assert client.channel.queue_declare(queue, passive=True).method.message_count == 0  # a dry run sends nothing

    workers.start(C.EXECUTOR)
    workers.wait_ready()
    done = json.loads(_cli(env, "sweep", "--json").stdout)
    assert [f["action"] for f in done if f["run_id"] == run_id] == ["republish"]
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", workers.logs()
    assert (tmp_path / f"ledger-{run_id}.txt").read_text().count(":only:") == 1
    assert store.get_run(run_id).redrives == 1  # type: ignore[union-attr]


def test_a_holder_whose_lock_outlived_its_acked_message_does_not_strand_the_run(
    workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path
) -> None:
    """The executor gives up retrying a held step (a 1 s window here) and acks it; then the holder dies."""
    workers.env.update(AGENTFLEET_STALL_AFTER_S="2", AGENTFLEET_SWEEP_INTERVAL_S="0.5",
                       AGENTFLEET_STEP_RETRY_WINDOW_S="1")
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    goal_id = f"orphan-{uuid.uuid4().hex}"
    run_id = run_id_for("single", goal_id)
    key = idempotency_key(run_id, 0, "tool", "w1")
    client = AmqpClient()
    with step_held(store, key):
        corr = client.publish_goal(namespace, "goal.single", {"agent": "single", "input": {}, "goal_id": goal_id})
        _until(lambda: workers.logged("leaving it to its holder"))
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", workers.logs()
    assert (tmp_path / f"ledger-{run_id}.txt").read_text().count(":only:") == 1
    assert workers.logged("re-driving a stalled run")


def test_a_run_the_sweeper_cannot_re_drive_does_not_stop_it_re_driving_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored event that no longer validates (an event model changed across an upgrade, a row edited by hand) made
    the re-drive of its run raise, and with it the whole pass: every pass stopped at that run, the oldest quiet one,
    and no stalled run behind it was re-driven again. The run is reported as not re-driven, the others are."""
    from datetime import timedelta

    from agentfleet.loop.recovery import Action
    from agentfleet.roles.sweeper import sweep
    from agentfleet.store.records import now
    from tests.helpers import embedded_fleet, wait_for_run

    with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
        store, rt = fleet.store, fleet.runtime
        broken, behind = run_id_for("single", "broken"), run_id_for("single", "behind")
        with store.tx() as conn:  # stalled executing iteration 1, its stored call no longer an event
            run = store.start_run(conn, run_id=broken, agent="single", goal_id="broken", trace_id="t", input={},
                                  limits={})
            run = store.transition(conn, run, RunState.PLANNING)
            assert run is not None
            assert store.transition(conn, run, RunState.EXECUTING, iteration=1) is not None
            store.mark_processed(conn, "e-broken", C.PLANNER, [
                {"event_id": "e-call", "type": "tool.requested", "run_id": broken, "trace_id": "t",
                 "payload": {"iteration": 1, "call": "no longer a call"}}], run_id=broken)
        with store.tx() as conn:  # quiet since after it: its first plan never made
            store.start_run(conn, run_id=behind, agent="single", goal_id="behind", trace_id="t2", input={},
                            limits={})
        findings = sweep(rt, at=now() + timedelta(seconds=rt.settings.stall_after_s + 60))
        assert findings is not None
        by_run = {f.run_id: f for f in findings}
        assert by_run[behind].action == Action.RESUBMIT and "not done" not in by_run[behind].reason
        assert by_run[broken].action == Action.REPUBLISH and by_run[broken].events == 0
        assert "not done (MalformedEvent)" in by_run[broken].reason
        assert "no longer a call" not in by_run[broken].reason  # what was stored is not shown
        assert "could not re-drive" in caplog.text and "no longer a call" not in caplog.text  # nor logged
        assert wait_for_run(store, behind).result["status"] == "succeeded"  # type: ignore[index]
        assert store.get_run(broken).state == RunState.EXECUTING  # type: ignore[union-attr]


def test_a_run_re_driven_in_a_pass_is_not_re_driven_again_when_it_moves_before_the_next_page(tmp_path: Path) -> None:
    """The pass reads quiet runs a page at a time, keyed on ``updated_at``, which the re-drive makes move. A run
    moved between two reads to a time still before the pass's cut-off (a worker whose clock lags the sweeper's; a
    sweep asked about a later moment, as in CI, where the fleet moved the run mid-pass) came back on the next page
    and was re-driven a second time in the same pass. Here its re-drive is lost and a worker moves it by hand before
    the next read, so the second page always holds it."""
    from datetime import timedelta

    from agentfleet.loop.recovery import Action
    from agentfleet.roles.sweeper import sweep
    from agentfleet.store.records import now
    from tests.helpers import embedded_fleet

    with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
        store, rt = fleet.store, fleet.runtime
        run_id = run_id_for("single", "moved")
        with store.tx() as conn:  # its first plan never made
            store.start_run(conn, run_id=run_id, agent="single", goal_id="moved", trace_id="t", input={}, limits={})
        publish, sent = rt.publisher.publish, []

        def lose_the_first_and_move_the_run(events, **kwargs):  # type: ignore[no-untyped-def]
            sent.append(list(events))
            if len(sent) > 1:
                return publish(sent[-1], **kwargs)
            with store.tx() as conn:  # a worker elsewhere takes the run on, and stops
                assert store.transition(conn, store.get_run(run_id, conn, lock=True), RunState.PLANNING)

        rt.publisher.publish = lose_the_first_and_move_the_run  # type: ignore[method-assign]
        findings = sweep(rt, at=now() + timedelta(seconds=rt.settings.stall_after_s + 60))
        assert findings is not None
        assert [(f.run_id, f.action) for f in findings] == [(run_id, Action.RESUBMIT)], findings
        assert len(sent) == 1


def test_a_broker_away_mid_pass_ends_the_pass_rather_than_marking_every_run_re_driven(tmp_path: Path) -> None:
    """Containing a failed re-drive to its run is for what is wrong with that run. With the broker away every re-drive
    fails alike: going on marked each of up to a batch of runs re-driven (so not tried again for a stall period) with
    nothing sent, and logged a traceback for each. The pass ends at the first such failure; the next sweep goes on."""
    from datetime import timedelta

    from kombu.exceptions import OperationalError

    from agentfleet.roles.sweeper import sweep
    from agentfleet.store.records import now
    from tests.helpers import embedded_fleet

    with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
        store, rt = fleet.store, fleet.runtime
        first, second = run_id_for("single", "first"), run_id_for("single", "second")
        for run_id in (first, second):
            with store.tx() as conn:  # its first plan never made
                store.start_run(conn, run_id=run_id, agent="single", goal_id=run_id, trace_id="t", input={}, limits={})

        def broker_away(events, **kwargs):  # type: ignore[no-untyped-def]
            raise OperationalError("[Errno 111] Connection refused")

        rt.publisher.publish = broker_away  # type: ignore[method-assign]
        with pytest.raises(OperationalError):
            sweep(rt, at=now() + timedelta(seconds=rt.settings.stall_after_s + 60))
        assert [store.get_run(r).redrives for r in (first, second)] == [1, 0]  # type: ignore[union-attr]
