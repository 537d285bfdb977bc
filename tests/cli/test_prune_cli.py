"""``agentfleet prune`` as a user types it (embedded: the SQLite database of `agentfleet run`)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.cli.test_graph_cli import MESSY, cli


def test_prune_deletes_what_ended_before_its_keeping_time_and_says_what_and_how_big(tmp_path: Path) -> None:
    runs = [json.loads(cli(tmp_path, "run", "tidy", "--input", json.dumps({"source": MESSY + str(i)}),
                           "--json").stdout)["run_id"] for i in range(2)]
    old = (datetime.now(UTC) - timedelta(days=40)).isoformat()
    with sqlite3.connect(tmp_path / "fleet.db") as db:
        db.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (old, runs[0]))
    nothing = cli(tmp_path, "prune", "--embedded")
    assert nothing.returncode == 2 and "no keeping time" in nothing.stderr
    dry = cli(tmp_path, "prune", "--older-than", "30d", "--dry-run", "--embedded", "--json")
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert counted["dry_run"] and counted["runs"] == 1 and counted["rows"]["steps"] > 0
    assert counted["dead_letters"] is None  # the embedded broker lives in the fleet's process
    shown = cli(tmp_path, "prune", "--older-than", "30d", "--embedded")
    assert shown.returncode == 0, shown.stderr
    assert "deleted 1 run(s): " in shown.stdout and "db " in shown.stdout and " before, " in shown.stdout
    assert cli(tmp_path, "status", runs[0], "--embedded").returncode == 2  # gone
    assert cli(tmp_path, "status", runs[1], "--embedded").returncode == 0  # kept
    again = json.loads(cli(tmp_path, "prune", "--older-than", "30d", "--embedded", "--json").stdout)
    assert again["runs"] == 0
    bad = cli(tmp_path, "prune", "--older-than", "soon", "--embedded")
    assert bad.returncode == 2 and "--older-than 'soon'" in bad.stderr
