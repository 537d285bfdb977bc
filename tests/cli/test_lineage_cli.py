"""``agentfleet retry`` and ``agentfleet fork`` as a user types them (embedded)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli.test_graph_cli import cli as graph_cli


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return graph_cli(tmp_path, *args, agents="tests.fixtures.agents")


def test_retry_goes_on_and_fork_replans_and_status_says_from_where(tmp_path: Path) -> None:
    (tmp_path / "model-down").touch()
    failed = json.loads(cli(tmp_path, "run", "steady", "--json").stdout)
    assert failed["status"] == "failed" and failed["error_code"] == "MODEL_ERROR"
    (tmp_path / "model-down").unlink()
    retried = cli(tmp_path, "retry", failed["run_id"], "--embedded", "--json")
    assert retried.returncode == 0, retried.stderr
    result = json.loads(retried.stdout)
    assert result["status"] == "succeeded" and result["output"]["seen"] == [4]
    shown = cli(tmp_path, "status", result["run_id"], "--embedded")
    assert f"a retry of run {failed['run_id']}, from its iteration 3" in shown.stdout, shown.stdout
    forked = cli(tmp_path, "fork", failed["run_id"], "--from", "2", "--edit-input", '{"tag": "f"}', "--embedded",
                 "--json")
    assert forked.returncode == 0 and json.loads(forked.stdout)["status"] == "succeeded", forked.stderr
    again = cli(tmp_path, "retry", result["run_id"], "--embedded")
    assert again.returncode == 2 and "only a failed or cancelled run is retried" in again.stderr
