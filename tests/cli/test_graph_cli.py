"""``agentfleet graph show`` and ``graph replay --from``, as a user types them (embedded: no services)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

MESSY = "def f():\n\treturn 1   \nx = 2"


def cli(tmp_path: Path, *args: str, agents: str = "agentfleet.examples.tidy") -> subprocess.CompletedProcess[str]:
    """The command as a user types it, in ``tmp_path`` (its embedded database and workspace there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLEET_")}
    env.update({"PYTHONPATH": str(ROOT), "AGENTFLEET_AGENTS": agents, "COLUMNS": "300",
                "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/fleet.db",
                "AGENTFLEET_WORKSPACE": str(tmp_path)})
    return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=180)


def test_show_prints_the_graph_as_mermaid_and_names_what_is_not_a_graph(tmp_path: Path) -> None:
    shown = cli(tmp_path, "graph", "show", "tidy")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("flowchart TD\n")
    assert 'n_lint -.->|"problems"| n_fix' in shown.stdout and 'n_fix(["fix · agent tidier"])' in shown.stdout
    as_json = json.loads(cli(tmp_path, "graph", "show", "tidy", "--json").stdout)
    assert [n["name"] for n in as_json["nodes"]] == ["lint", "fix", "count_lines", "count_words", "report"]
    missing = cli(tmp_path, "graph", "show", "tidier")
    assert missing.returncode == 2 and "no graph named 'tidier' is loaded (graphs: tidy)" in missing.stderr


def test_replay_from_a_node_starts_a_new_run_there_with_the_state_edited(tmp_path: Path) -> None:
    ran = cli(tmp_path, "run", "tidy", "--input", json.dumps({"source": MESSY}), "--json")
    assert ran.returncode == 0, ran.stderr
    first = json.loads(ran.stdout)
    forked = cli(tmp_path, "graph", "replay", first["run_id"], "--from", "fix", "--edit", '{"source": "a\\tb"}',
                 "--embedded", "--json")
    assert forked.returncode == 0, forked.stderr
    result = json.loads(forked.stdout)
    assert result["status"] == "succeeded" and result["run_id"] != first["run_id"]
    assert result["goal_id"].startswith(f"fork-{first['run_id'][:8]}-fix-1-")
    assert result["output"]["source"] == "a    b\n" and result["output"]["fixes"] == ["line 1", "final newline"]
    never = cli(tmp_path, "graph", "replay", first["run_id"], "--from", "report", "--step", "0", "--embedded")
    assert never.returncode == 2 and "node 'report' was never due in run" in never.stderr
