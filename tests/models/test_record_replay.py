"""A real run recorded to a cassette, replayed strictly on the current code (issue 8): the same Result when
nothing changed; the divergence named when a tool's result did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pytest_httpserver import HTTPServer

from tests.conftest import ROOT

TEXT = "A fleet of agents, one step at a time."


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTFLEET_AGENTS": "agentfleet.examples.word_stats", "PYTHONPATH": str(ROOT),
           "AGENTFLEET_WORKSPACE": str(tmp_path), "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/f.db"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)


def test_a_recorded_run_replays_to_the_same_result_and_an_edited_tool_result_is_named(
        word_stats_server: HTTPServer, tmp_path: Path) -> None:
    cassette = tmp_path / "run.cassette.json"
    model = f"openai-compatible:{word_stats_server.url_for('/v1')}:smollm2"
    recorded = cli(tmp_path, "run", "word_stats", "--input", json.dumps({"text": TEXT}), "--model", model,
                   "--record", str(cassette))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "recorded 2 model turns" in recorded.stdout and len(word_stats_server.log) == 2
    kept = json.loads(cassette.read_text())
    assert kept["agent"] == "word_stats" and kept["goal"] == {"text": TEXT}
    assert kept["result"]["output"] == {"words": 9, "longest": "agents"}
    assert all(len(t["fingerprint"]) == 24 and t["messages"] for t in kept["turns"])

    (tmp_path / "again").mkdir()  # a fresh database: the replay is a new run of the recorded goal
    replayed = cli(tmp_path / "again", "replay", str(cassette), "--json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    report = json.loads(replayed.stdout.strip().splitlines()[-1])
    assert [s["matched"] for s in report["steps"]] == [True, True] and report["result_matches"]
    assert len(word_stats_server.log) == 2  # the replay asked no model

    result_message = next(m for m in kept["turns"][1]["messages"] if m.get("tool_call_id") == "w1")
    result_message["content"] = result_message["content"].replace('"words": 9', '"words": 8')
    cassette.write_text(json.dumps(kept))
    (tmp_path / "edited").mkdir()
    diverged = cli(tmp_path / "edited", "replay", str(cassette))
    assert diverged.returncode == 1, diverged.stdout + diverged.stderr
    assert "iteration 0: same request as recorded" in diverged.stdout
    assert re.search(r"iteration 1: diverged: message \d+ \(tool, result of call w1\) differs", diverged.stdout)
    assert '"words": 8' in diverged.stdout and '"words": 9' in diverged.stdout


def test_replaying_a_hand_written_cassette_is_refused_with_how_to_record(tmp_path: Path) -> None:
    from agentfleet.examples import word_stats

    done = cli(tmp_path, "replay", str(Path(word_stats.__file__).with_name("word_stats.cassette.json")))
    assert done.returncode == 2 and "--record" in done.stderr
