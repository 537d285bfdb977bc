"""`make test` runs chaos and alone tests by themselves and the rest two at a time (Makefile). Run by hand under
pytest-xdist, a chaos test would restart a service beneath the other process's tests, and an alone test would
measure the other process's CPU: refused before any test runs, with the way to run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("target", [
    "tests/workers/test_pool.py::test_a_task_wakes_the_one_thread_that_runs_it_not_every_idle_one",  # alone
    # chaos, one that stops only its own fleet should the refusal fail; its fixtures want the services
    pytest.param("tests/workers/test_graceful_shutdown.py", marks=pytest.mark.integration),
])
def test_chaos_and_alone_tests_are_refused_beside_another_process(target: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", target],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0, done.stdout[-2000:]
    assert "run by themselves" in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]
    assert " passed" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
