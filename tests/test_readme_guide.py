"""The README's guide to writing an agent, run as written (issue 8): its files are saved, its commands run
in order in a fresh directory, with a local server speaking OpenAI's API where the guide's model server is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pytest_httpserver import HTTPServer

from tests.conftest import ROOT

GUIDE = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"<!-- guide-(file: (?P<name>\S+)|run) -->\n```\w+\n(?P<body>.*?)```", re.DOTALL)
LOCAL_SERVER = "http://127.0.0.1:8080"


def test_the_guide_has_files_and_commands() -> None:
    found = [m.group("name") or "run" for m in BLOCK.finditer(GUIDE)]
    assert found[:2] == ["word_stats.py", "word_stats.cassette.json"] and found.count("run") == 4


def test_the_guides_agent_is_the_bundled_example() -> None:
    files = {m.group("name"): m.group("body") for m in BLOCK.finditer(GUIDE) if m.group("name")}
    bundled = ROOT / "agentfleet" / "examples" / "word_stats"
    assert files["word_stats.py"] == (bundled / "__init__.py").read_text()
    assert files["word_stats.cassette.json"] == (bundled / "word_stats.cassette.json").read_text()


def test_the_guide_runs_as_written(word_stats_server: HTTPServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLEET_") and k != "OPENAI_API_KEY"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = ["set -euo pipefail"]
    for match in BLOCK.finditer(GUIDE):
        if match.group("name"):
            (tmp_path / match.group("name")).write_text(match.group("body"), encoding="utf-8")
            continue
        for line in match.group("body").splitlines():
            if line.startswith("$ "):
                command = line[2:].replace(LOCAL_SERVER, word_stats_server.url_for("").rstrip("/"))
                script += [f"echo '>>> {command}'", command.replace("python ", f"{sys.executable} ", 1)]
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    said = done.stdout
    assert said.count('"longest": "agents"') >= 2  # the cassette run and the model's
    assert "recorded 2 model turns to run.cassette.json" in said
    assert "iteration 1: same request as recorded" in said and "result: same as recorded" in said
    assert "3 passed" in said
    assert len(word_stats_server.log) == 2
