"""`agentfleet chaos` at a small size: kills of every role (aimed mid-call too), a broker and a database restart."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, require

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.parametrize("agent", ["chaos_ledger", "chaos_graph"])
def test_a_small_chaos_run_loses_nothing_repeats_nothing_and_invents_nothing(pg_url: str, tmp_path: Path,
                                                                              agent: str) -> None:
    require("rabbitmq", "postgres")
    assert shutil.which("rabbitmqctl") and shutil.which("pg_ctlcluster"), "the chaos test restarts local services"
    env = {**os.environ, "AGENTFLEET_DATABASE_URL": pg_url, "AGENTFLEET_NAMESPACE": f"aftest-{tmp_path.name[-8:]}",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "agentfleet.cli", "chaos", "--runs", "16", "--duration", "18",
                           "--kills", "4", "--settle", "120", "--seed", "7", "--agent", agent, "--json"],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=400)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, (report, done.stderr[-3000:])
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0)
    assert report["accepted"] == 16 and report["ended"] == 16 and report["answered"] == 16
    kinds = [f["kind"] for f in report["faults"]]
    assert kinds.count("broker-restart") == 1 and kinds.count("database-restart") == 1
    assert all(f["note"].startswith("restarted") for f in report["faults"] if "restart" in f["kind"])
    killed_roles = {f["target"].split(".")[0] for f in report["faults"] if f["kind"].startswith("kill")}
    assert {"planner", "observer"} <= killed_roles and "executor" in killed_roles
    assert all(f["recovery_s"] is not None for f in report["faults"]), report["faults"]
