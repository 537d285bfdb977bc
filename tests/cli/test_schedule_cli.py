"""``agentfleet schedule`` as a user types it (embedded: the SQLite database of `agentfleet run`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_graph_cli import cli


def test_add_list_pause_resume_delete_and_what_is_refused(tmp_path: Path) -> None:
    added = cli(tmp_path, "schedule", "add", "nightly", "--agent", "tidy", "--input", '{"source": "x"}',
                "--cron", "0 2 * * *", "--tz", "Europe/Berlin", "--jitter", "30s", "--embedded")
    assert added.returncode == 0, added.stderr
    assert "schedule nightly: 0 2 * * * (Europe/Berlin), next at " in added.stdout
    assert cli(tmp_path, "schedule", "add", "often", "--agent", "tidy", "--every", "5m", "--embedded").returncode == 0
    listed = {s["schedule"]: s for s in json.loads(cli(tmp_path, "schedule", "list", "--embedded", "--json").stdout)}
    assert listed["nightly"]["when"] == "0 2 * * *" and listed["nightly"]["jitter_s"] == 30
    assert listed["often"]["when"] == "every 300s" and listed["often"]["paused"] is False
    assert cli(tmp_path, "schedule", "pause", "often", "--embedded").returncode == 0
    again = json.loads(cli(tmp_path, "schedule", "list", "--embedded", "--json").stdout)
    assert [s["paused"] for s in again if s["schedule"] == "often"] == [True]
    assert "resumed, next at" in cli(tmp_path, "schedule", "resume", "often", "--embedded").stdout
    assert cli(tmp_path, "schedule", "delete", "often", "--embedded").returncode == 0
    for args, said in ((["add", "nightly", "--agent", "tidy", "--every", "1m"], "exists"),
                       (["add", "bad", "--agent", "tidy", "--cron", "61 * * * *"], "cron expression"),
                       (["add", "bad", "--agent", "tidy"], "either a cron expression or an interval"),
                       (["add", "bad", "--agent", "tidy", "--every", "1m", "--tz", "Mars/Base"], "unknown time zone"),
                       (["delete", "often"], "no schedule named 'often'")):
        refused = cli(tmp_path, "schedule", *args, "--embedded")
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
