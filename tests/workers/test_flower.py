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
    """Task events are off until someone watches; Flower switches them on in the workers it sees (every 5 s), and
    from then on a run's tasks are listed under their event-type names."""
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    expected_workers = {workers.name(C.PLANNER, 0), workers.name(C.EXECUTOR, 1), workers.name(C.OBSERVER, 2)}
    expected_tasks = {"goal.submitted", "tool.requested", "tool.completed", "observation.recorded",
                      "run.completed"}
    client = AmqpClient()
    deadline = time.monotonic() + 45
    listed: set[str] = set()
    run_tasks: set[str] = set()
    while time.monotonic() < deadline and not (expected_workers <= listed and expected_tasks <= run_tasks):
        corr = client.publish_goal(namespace, "goal.ledger", {"agent": "ledger", "input": {}})
        result = client.replies(1)[corr]
        assert result["status"] == "succeeded"
        settle = time.monotonic() + 3  # a run Flower watched shows all its tasks within moments of its end
        while time.monotonic() < settle:
            listed = set(httpx.get(f"{flower}/api/workers", params={"refresh": "1"}, timeout=10).json())
            tasks = httpx.get(f"{flower}/api/tasks", timeout=10).json()
            run_tasks = {t["name"] for t in tasks.values() if result["run_id"] in (t.get("kwargs") or "")}
            if expected_workers <= listed and expected_tasks <= run_tasks:
                break
            time.sleep(0.5)
    client.close()
    assert expected_workers <= listed
    assert expected_tasks <= run_tasks, "Flower shows a run's work under its event-type names"
