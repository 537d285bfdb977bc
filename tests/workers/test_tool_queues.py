"""Dedicated tool queues on the real fleet: a tool declared with queue="gpu" runs only on the executor started
with --queues gpu; while none is, it is not offered and a call of it is answered at once, never left waiting."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.events.publisher import CONSUMERS_VIEW_S
from agentfleet.events.topology import Topology
from agentfleet.ops.control import live_workers, tool_queues_view
from agentfleet.store import Store
from agentfleet.workers.app import create_app
from tests.conftest import BROKER_URL, WorkerProcs
from tests.fleet.test_health_gate_fleet import lines, seen, submit
from tests.helpers import AmqpClient, eventually

pytestmark = pytest.mark.integration


def test_a_queue_bound_tool_runs_only_where_its_queue_is_consumed(
        workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path) -> None:
    for role in (C.PLANNER, C.OBSERVER, C.EXECUTOR):
        workers.start(role)
    workers.wait_ready()
    app = create_app(Settings(broker_url=BROKER_URL, namespace=namespace))
    topology = Topology(namespace)
    client = AmqpClient()

    corr, run = submit(client, namespace, "gpu_user", {"scene": "before"})
    (refused,) = seen(client.replies(1, timeout=60)[corr])
    assert refused["ok"] is False and refused["error_code"] == "TOOL_UNAVAILABLE", refused
    assert "consuming queue 'gpu'" in refused["message"]
    assert lines(tmp_path / f"offered-{run}.txt") == ["final_answer"]  # not offered: the model was told why
    plan = next(s for s in store.steps(run) if s["kind"] == "plan" and s["iteration"] == 0)
    assert "render (no executor consumes its queue 'gpu')" in plan["input"]["notice"]
    assert not lines(tmp_path / "render-body.txt")
    view = tool_queues_view(app, topology, live_workers(app, topology), ("gpu",))
    assert view == {"gpu": {"ready": 0, "consumers": 0}}  # what `agentfleet workers` shows

    gpu = workers.start(C.EXECUTOR, "--queues", "gpu")
    workers.wait_ready()
    eventually(lambda: tool_queues_view(app, topology, [], ("gpu",))["gpu"]["consumers"] == 1,
               message="the gpu executor consumes its queue")
    found = {w.name: w for w in live_workers(app, topology)}
    gpu_worker = next(w for w in found.values() if w.tool_queues == ("gpu",))
    assert gpu_worker.roles == (C.EXECUTOR,)
    time.sleep(CONSUMERS_VIEW_S)  # the planner's view of the queue's consumers is that old at most

    done: dict[str, Any] = {}
    for i in range(3):
        corr, _ = submit(client, namespace, "gpu_user", {"scene": f"s{i}"})
        done[corr] = f"s{i}"
    replies = client.replies(3, timeout=60)
    for corr, scene in done.items():
        (ran,) = seen(replies[corr])
        assert ran == {"ok": True, "output": {"scene": scene, "pid": gpu.pid}}, ran
    assert {line.split()[1] for line in lines(tmp_path / "render-body.txt")} == {str(gpu.pid)}
    client.close()


def test_the_embedded_fleet_runs_queue_bound_tools_in_its_one_executor(tmp_path: Path) -> None:
    from tests.helpers import embedded_fleet, wait_for_run

    with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
        run = wait_for_run(fleet.store, fleet.submit({"agent": "gpu_user", "input": {"scene": "here"}}))
    assert run.result is not None and run.result["output"]["seen"] == [
        {"ok": True, "output": {"scene": "here", "pid": os.getpid()}}], run.result


def test_a_queue_name_is_checked_where_it_is_declared() -> None:
    from agentfleet import tool
    from agentfleet.errors import ConfigurationError

    def paint() -> dict:
        """Paint."""
        return {}

    assert tool(queue="gpu-2")(paint).queue == "gpu-2"
    for bad in ("GPU", "default", "a.b", "", "x" * 41):
        with pytest.raises(ConfigurationError, match="queue"):
            tool(queue=bad)(paint)
