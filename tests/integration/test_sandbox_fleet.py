"""Subprocess tools on the real fleet: escape attempts answered with codes while the fleet runs on, and a
cancelled run's tool process gone from the process table."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentfleet import constants as C
from agentfleet.harness.sandbox import support
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.fixtures.agents import ESCAPED, LINGER_MARKER, NAP_MARKER
from tests.helpers import AmqpClient, eventually, processes_with
from tests.integration.test_health_gate import start_fleet, submit


@pytest.fixture(autouse=True)
def _sandbox() -> None:
    found = support(refresh=True)
    assert found.available, found.detail  # make test installs bubblewrap; without it this must fail, not skip


def test_every_escape_attempt_is_stopped_and_the_fleet_runs_on(workers: WorkerProcs, namespace: str,
                                                              store: Store, tmp_path: Path) -> None:
    canary = Path.home() / f".agentfleet-canary-{namespace}"
    canary.write_text("CANARY")
    try:
        start_fleet(workers)
        client = AmqpClient()
        corr, run_id = submit(client, namespace, "escapist")
        result = client.replies(1, timeout=120)[corr]
        assert result["status"] == "succeeded", result
        told = {s["name"]: s["output"] for s in store.steps(run_id) if s["kind"] == "tool"}
        assert "refused" in told["to_broker"]["output"].lower()  # no network namespace route to the broker
        assert told["to_home"]["output"] == "No such file or directory"  # the worker's home is not there
        assert "AGENTFLEET_DATABASE_URL" not in told["to_env"]["output"]  # the environment is cleared
        assert told["hog"]["error_code"] == "INTERNAL" and "MemoryError" in told["hog"]["message"]
        assert told["spin"]["error_code"] == "RESOURCE_LIMIT"
        assert told["bomb"]["error_code"] in ("TIMEOUT", "INTERNAL")
        assert told["to_outside"]["output"] in ("Read-only file system", "No such file or directory")
        assert not ESCAPED.exists()
        assert told["linger"]["error_code"] == "TIMEOUT" and processes_with(LINGER_MARKER) == []
        # Every worker is still up, and the next goal runs as usual.
        assert all(proc.poll() is None for _, proc in workers.procs) and len(workers.procs) == len(C.ROLES)
        corr2, _ = submit(client, namespace, "wired")
        assert client.replies(1, timeout=60)[corr2]["status"] == "succeeded"
    finally:
        canary.unlink()


def test_a_cancelled_run_on_the_fleet_leaves_no_tool_process(workers: WorkerProcs, namespace: str,
                                                             store: Store) -> None:
    from agentfleet.config.settings import get_settings
    from agentfleet.workers.client import FleetClient

    start_fleet(workers)
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "napper", {"seconds": 90})
    eventually(lambda: processes_with(NAP_MARKER), timeout=60, message="the nap never started")
    with FleetClient(get_settings()) as fleet:
        fleet.cancel(run_id, "changed my mind")
    assert client.replies(1, timeout=30)[corr]["status"] == "cancelled"
    started = time.monotonic()
    eventually(lambda: not processes_with(NAP_MARKER), timeout=15, message="the tool outlived its cancelled run")
    assert time.monotonic() - started < 15
