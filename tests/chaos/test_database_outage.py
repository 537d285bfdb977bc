"""Postgres down for 15 s with runs in flight: steps wait out the outage in the broker, and every run finishes."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from agentfleet import constants as C
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient


def _pg_ctl(action: str, *extra: str) -> None:
    version = sorted(Path("/etc/postgresql").glob("*/main"))[-1].parent.name
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, *extra],
                   check=True, capture_output=True, timeout=120)


def test_runs_in_flight_ride_out_a_database_outage(workers: WorkerProcs, namespace: str, tmp_path: Path) -> None:
    assert shutil.which("pg_ctlcluster"), "this test stops and starts the local Postgres"
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    client = AmqpClient()
    sent = [client.publish_goal(namespace, "goal.ledger", {"agent": "ledger", "input": {}}) for _ in range(4)]
    time.sleep(0.3)  # the runs are under way
    _pg_ctl("stop", "-m", "immediate")
    try:
        time.sleep(15)
    finally:
        _pg_ctl("start")
    replies = client.replies(len(sent), timeout=120)
    client.close()
    assert set(replies) == set(sent), workers.logs()[-4000:]
    assert all(r["status"] == "succeeded" for r in replies.values()), replies
    for reply in replies.values():  # each non-idempotent call wrote at most once (UNKNOWN_OUTCOME, never twice)
        ledger = tmp_path / f"ledger-{reply['run_id']}.txt"
        entries = [line.split(":")[1] for line in ledger.read_text().splitlines()] if ledger.exists() else []
        assert len(entries) == len(set(entries))
    assert all(p.poll() is None for _, p in workers.procs)
    assert any("step will be retried" in log.read_text() for log in workers.logdir.glob("*.log"))
