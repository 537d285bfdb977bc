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
