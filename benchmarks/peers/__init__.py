"""Peers measured beside agentfleet, in their own virtual environment (``benchmarks/.peers-venv``).

The scripts in this folder run under that environment's interpreter, never the project's:
DBOS and LangGraph are what a user would pick instead, not dependencies.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE.parent / ".peers-venv"
REQUIREMENTS = HERE / "requirements.txt"


def venv_bin(name: str) -> Path:
    """A program of the peers' environment, creating it (or re-installing when the pins change) first."""
    stamp = VENV / ".requirements"
    wanted = REQUIREMENTS.read_text()
    if not (stamp.exists() and stamp.read_text() == wanted):
        for argv in ([sys.executable, "-m", "venv", str(VENV)],
                     [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                      "-r", str(REQUIREMENTS)]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"setting up the peers' environment failed: {' '.join(argv)}\n"
                                   f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
        stamp.write_text(wanted)
    return VENV / "bin" / name


def libpq_url(sqlalchemy_url: str) -> str:
    """``postgresql+psycopg://…`` → ``postgresql://…``: what psycopg's conninfo (LangGraph) and DBOS take."""
    scheme, rest = sqlalchemy_url.split("://", 1)
    return f"{scheme.split('+')[0]}://{rest}"


def run_peer(script: str, database_url: str, size: int, timeout: float = 900) -> dict[str, Any]:
    """Run ``script`` in the peers' environment against ``database_url``; its JSON line."""
    with tempfile.TemporaryDirectory() as tmp:  # DBOS looks for a config file in its working directory
        done = subprocess.run([str(venv_bin("python")), str(HERE / script), libpq_url(database_url), str(size)],
                              capture_output=True, text=True, timeout=timeout, cwd=tmp)
    if done.returncode != 0:
        raise RuntimeError(f"peer {script} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
