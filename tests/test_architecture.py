"""The rooms of docs/architecture.md, as the import contract in pyproject.toml states them: kept by the tree, and
broken by a lower room importing a higher one or by a circle inside a room (so the contract can fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """The contract checked as `make test` checks it, on the package under ``root`` (a process of its own: grimp
    finds the package through the import system, which this process has already filled)."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_the_tree_keeps_the_contract() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.parametrize(("module", "line"), [
    ("store/spend.py", "from agentfleet.roles import step  # a lower room importing a higher one"),
    ("tools/health.py", "import agentfleet.tools.tool  # a circle inside a room (tool imports health)"),
    ("loop/states.py", "import sqlalchemy  # the pure core reaching for a database"),
    ("fleet/gate.py", "import agentfleet.store.base  # two rooms on one line that must not know each other"),
])
def test_the_contract_fails_when_a_room_is_broken(tmp_path: Path, module: str, line: str) -> None:
    shutil.copytree(ROOT / "agentfleet", tmp_path / "agentfleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "agentfleet" / module).open("a") as f:
        f.write(os.linesep + line + os.linesep)
    done = lint(tmp_path)
    assert done.returncode == 1 and "BROKEN" in done.stdout, done.stdout[-3000:]
