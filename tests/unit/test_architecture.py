"""The rooms of docs/architecture.md, as the import contract in pyproject.toml states them: kept by the tree, and
broken by a lower room importing a higher one or by a circle inside a room (so the contract can fail)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def lint(root: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "agentfleet" or m.startswith("agentfleet.")]:
        monkeypatch.delitem(sys.modules, name)  # grimp finds the package through the import system
    return lint_imports(config_filename=str(root / "pyproject.toml"), no_cache=True)


def test_the_tree_keeps_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lint(ROOT, monkeypatch) == 0


@pytest.mark.parametrize(("module", "line"), [
    ("store/spend.py", "from agentfleet.roles import step  # a lower room importing a higher one"),
    ("tools/health.py", "import agentfleet.tools.tool  # a circle inside a room (tool imports health)"),
    ("loop/states.py", "import sqlalchemy  # the pure core reaching for a database"),
    ("fleet/gate.py", "import agentfleet.store.base  # two rooms on one line that must not know each other"),
])
def test_the_contract_fails_when_a_room_is_broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str,
                                                   line: str) -> None:
    shutil.copytree(ROOT / "agentfleet", tmp_path / "agentfleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "agentfleet" / module).open("a") as f:
        f.write(os.linesep + line + os.linesep)
    assert lint(tmp_path, monkeypatch) == 1
