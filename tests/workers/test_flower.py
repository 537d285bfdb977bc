"""Flower, started by `agentfleet flower`, shows the role workers and the run's tasks by event type."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from agentfleet import constants as C
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient
from tests.helpers import flower as flower_process

pytestmark = pytest.mark.integration


@pytest.fixture
def flower(workers: WorkerProcs) -> Iterator[str]:
    with flower_process(workers.env, workers.logdir) as base:
        yield base


def test_flower_lists_the_role_workers_and_the_runs_tasks_by_event_type(
    workers: WorkerProcs, flower: str, namespace: str
) -> None:
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    client = AmqpClient()
    corr = client.publish_goal(namespace, "goal.ledger", {"agent": "ledger", "input": {}})
    result = client.replies(1)[corr]
    client.close()
    assert result["status"] == "succeeded"

    expected_workers = {workers.name(C.PLANNER, 0), workers.name(C.EXECUTOR, 1), workers.name(C.OBSERVER, 2)}
    expected_tasks = {"goal.submitted", "tool.requested", "tool.completed", "observation.recorded",
                      "run.completed"}
    deadline = time.monotonic() + 45
    listed: set[str] = set()
    names: set[str] = set()
    while time.monotonic() < deadline:
        listed = set(httpx.get(f"{flower}/api/workers", params={"refresh": "1"}, timeout=10).json())
        tasks = httpx.get(f"{flower}/api/tasks", timeout=10).json()
        names = {t.get("name") for t in tasks.values()}
        if expected_workers <= listed and expected_tasks <= names:
            break
        time.sleep(0.5)
    assert expected_workers <= listed
    assert expected_tasks <= names
    run_tasks = {t["name"] for t in tasks.values() if result["run_id"] in (t.get("kwargs") or "")}
    assert expected_tasks <= run_tasks, "Flower shows this run's work under its event-type names"
