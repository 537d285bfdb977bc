"""Subprocess tools on the real fleet: escape attempts answered with codes while the fleet runs on, and a
cancelled run's tool process gone from the process table."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentfleet import constants as C
from agentfleet.sandbox.bwrap import support
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.fixtures.agents import ESCAPED, LINGER_MARKER, NAP_MARKER
from tests.fleet.test_health_gate_fleet import start_fleet, submit
from tests.helpers import AmqpClient, eventually, processes_with

pytestmark = pytest.mark.integration


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
        from agentfleet.sandbox.call_bounds import host_bounds

        # With a cgroup per call the bomb is caught by its own pids.max; without, it runs into RLIMIT_NPROC.
        assert told["bomb"]["error_code"] in (("RESOURCE_LIMIT",) if host_bounds().cgroups else ("TIMEOUT",
                                                                                                  "INTERNAL"))
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
    from agentfleet.ops.client import FleetClient

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


def test_a_kept_work_directory_streams_to_the_store_without_growing_the_executor(
        workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path, distributed_env: dict[str, str]) -> None:
    """Containment 2: keep_workdir held a 300 MB tarball in the worker's memory (RSS 61 → 348 MiB)."""
    import hashlib
    import subprocess
    import sys
    import tarfile

    from tests.conftest import ROOT
    from tests.fixtures.agents import KEPT_MB

    def peak_mib(pid: int) -> float:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024

    start_fleet(workers)
    executor = workers.pid_of(workers.name(C.EXECUTOR, 2))
    assert executor is not None
    client = AmqpClient()
    corr, _ = submit(client, namespace, "wired")  # warm: the executor's own working set first
    client.replies(1, timeout=60)
    before = peak_mib(executor)
    corr, run_id = submit(client, namespace, "keeper")
    result = client.replies(1, timeout=120)[corr]
    client.close()
    assert result["status"] == "succeeded", result
    grown = peak_mib(executor) - before
    assert grown < KEPT_MB / 2, f"the executor's peak grew {grown:.0f} MiB for a {KEPT_MB} MiB tree"
    [kept] = store.artifacts_of(run_id)
    assert kept["kind"] == "workdir" and kept["size"] > KEPT_MB << 20
    out = tmp_path / "tree.tar.gz"
    cli = subprocess.run([sys.executable, "-m", "agentfleet.cli", "artifacts", run_id, "--ref", kept["ref"], "-o",
                          str(out)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={**distributed_env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert cli.returncode == 0, cli.stderr
    assert "sha256:" + hashlib.sha256(out.read_bytes()).hexdigest() == kept["ref"]  # whole, as it was kept
    with tarfile.open(out) as tar:
        assert tar.extractfile("./out/note.txt").read() == b"small\n"  # type: ignore[union-attr]
        assert tar.getmember("./out/data.bin").size == KEPT_MB << 20
    part = store.artifact_part(run_id, kept["ref"], (1 << 20) - 10, 20)  # across a chunk boundary
    assert part is not None and part[0] == out.read_bytes()[(1 << 20) - 10: (1 << 20) + 10]
