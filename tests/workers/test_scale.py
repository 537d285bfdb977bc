"""Scale a role live on the default (thread) pool: the CLI, Flower's API and autoscale (issue 13)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.events.topology import Topology
from agentfleet.ops.control import live_workers
from agentfleet.workers.app import create_app
from tests.conftest import BROKER_URL, ROOT, WorkerProcs
from tests.helpers import AmqpClient, eventually, flower

pytestmark = pytest.mark.integration


def sizes(namespace: str) -> dict[str, int]:
    app = create_app(Settings(broker_url=BROKER_URL, namespace=namespace))
    return {w.name: w.size for w in live_workers(app, Topology(namespace)) if C.EXECUTOR in w.roles}


def test_an_executor_scales_from_one_to_three_and_back_while_runs_keep_finishing(
        workers: WorkerProcs, namespace: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                              cwd=ROOT, env=workers.env, timeout=120)

    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR, "--concurrency", "1")
    workers.wait_ready()
    executor = workers.name(C.EXECUTOR, 2)
    assert sizes(namespace) == {executor: 1}
    client = AmqpClient()
    sent = [client.publish_goal(namespace, "goal.fanout", {"agent": "fanout", "input": {}}) for _ in range(3)]

    grown = cli("scale", "executor", "3", "--json")
    assert grown.returncode == 0, grown.stderr
    assert [(r["name"], r["before"], r["after"]) for r in json.loads(grown.stdout)] == [(executor, 1, 3)]
    assert sizes(namespace) == {executor: 3}  # what Celery's inspect says, apart from the command's own look

    listed = json.loads(cli("workers", "--json").stdout)
    [row] = [w for w in listed["workers"] if w["name"] == executor]
    assert (row["roles"], row["pool"], row["size"]) == (["executor"], "ResizableThreadPool", 3)

    with flower(workers.env, workers.logdir) as base:
        def shrink_through_flower() -> Any:
            answer = httpx.post(f"{base}/api/worker/pool/shrink/{executor}", params={"n": 1}, timeout=10)
            return answer if answer.status_code != 404 else None  # 404 until Flower has seen the worker

        answer = eventually(shrink_through_flower, timeout=60, message="Flower answers for the worker")
        assert answer.status_code == 200, answer.text
        assert sizes(namespace) == {executor: 2}

    back = cli("scale", "executor", "1", "--json")
    assert back.returncode == 0, back.stderr
    assert [(r["before"], r["after"]) for r in json.loads(back.stdout)] == [(2, 1)]
    replies = client.replies(len(sent), timeout=120)
    client.close()
    assert set(replies) == set(sent) and all(r["status"] == "succeeded" for r in replies.values()), replies
    refused = cli("scale", "planner", "0")
    assert refused.returncode == 2


def test_a_worker_started_with_autoscale_reports_and_moves_its_range(workers: WorkerProcs, namespace: str) -> None:
    workers.start(C.EXECUTOR, "--autoscale", "4,1")
    workers.wait_ready()
    app = create_app(Settings(broker_url=BROKER_URL, namespace=namespace))
    [worker] = live_workers(app, Topology(namespace))
    assert worker.autoscale == {"max": 4, "min": 1} and worker.pool == "ResizableThreadPool"
    done = subprocess.run([sys.executable, "-m", "agentfleet.cli", "scale", "executor", "6", "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=workers.env, timeout=120)
    assert done.returncode == 0, done.stderr
    [moved] = json.loads(done.stdout)
    assert "autoscale now max=6" in moved["answer"], moved
    [again] = live_workers(app, Topology(namespace))
    assert again.autoscale == {"max": 6, "min": 1}
