"""The workspace gives the model no secrets and no way to starve the executor (issue "Containment", case 19)."""

from __future__ import annotations

import ctypes
import os
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfleet import ToolContext
from agentfleet.config.settings import Settings
from agentfleet.errors import ErrorCode
from agentfleet.examples.disk_usage import du_usage
from agentfleet.examples.repo_report.tools import count_lines, list_files, read_file
from agentfleet.harness import run_tool


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('hi')\n")
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-canary-0123456789abcdef\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[remote]\n  url = https://user:canary-token@example.invalid\n")
    (tmp_path / "src" / ".secrets").write_text("canary\n")
    return tmp_path


def ctx(root: Path) -> ToolContext:
    return ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=root)


def test_the_default_workspace_is_a_folder_of_its_own_not_the_current_directory(
        monkeypatch: pytest.MonkeyPatch, project: Path) -> None:
    monkeypatch.delenv("AGENTFLEET_WORKSPACE", raising=False)
    monkeypatch.chdir(project)
    workspace = Settings().workspace
    assert workspace != project and workspace == project / ".agentfleet" / "workspace"


@pytest.mark.parametrize("path", [".env", ".git/config", "src/.secrets", "./.env", "src/../.env"])
def test_dotfiles_and_version_control_folders_are_refused(project: Path, path: str) -> None:
    result = run_tool(read_file, {"path": path}, ctx(project), 10)
    assert result.error_code == ErrorCode.PERMISSION_DENIED and "canary" not in str(result.model_dump())


def test_walks_skip_hidden_files_and_a_tool_may_opt_in(project: Path) -> None:
    listed = run_tool(list_files, {"path": "."}, ctx(project), 10)
    assert listed.ok and listed.output["files"] == ["src/app.py"]
    counted = run_tool(count_lines, {"path": "."}, ctx(project), 10)
    assert counted.output["files"] == 1
    shown = [e.path for e in ctx(project).workspace_files(hidden=True).walk(".")]
    assert ".env" in shown and ".git/config" in shown


def test_reading_ten_characters_of_a_huge_file_reads_ten_characters_worth(project: Path) -> None:
    """Was: read_file on a 500 MB file with max_chars=10 grew the executor to 1 GB."""
    big = project / "big.log"
    with big.open("wb") as f:
        for _ in range(64):
            f.write(b"a" * (1 << 20))
    tracemalloc.start()
    try:
        result = run_tool(read_file, {"path": "big.log", "max_chars": 10}, ctx(project), 10)
        counted = run_tool(count_lines, {"path": "big.log"}, ctx(project), 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok and result.output["text"] == "a" * 10 and result.output["truncated"]
    assert result.output["bytes"] == 64 << 20
    assert counted.ok and counted.output["total_lines"] == 1
    assert peak < 8 << 20, f"peak {peak >> 20} MiB for a 64 MiB file"


@pytest.fixture
def swapping(tmp_path: Path) -> Iterator[Path]:
    """A directory of the workspace exchanged, over and over, with a link to a big directory outside."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "d").mkdir(parents=True)
    outside.mkdir()
    (workspace / "d" / "small.txt").write_text("inside\n")
    (outside / "big.bin").write_bytes(os.urandom(4 << 20))
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def swap() -> None:
        a, b = str(workspace / "d").encode(), str(workspace / "link").encode()
        while not stop.is_set():
            libc.renameat2(-100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    yield workspace
    stop.set()
    thread.join()


def test_du_measures_by_descriptor_and_never_outside_under_a_directory_swap(swapping: Path) -> None:
    """Was: du_usage resolved the path, then ran du on it by name: 2 of 300 calls measured outside."""
    outside = 0
    for _ in range(300):
        result = run_tool(du_usage, {"path": "d"}, ctx(swapping), 10)
        if result.ok and result.output["kib"] >= 4096:
            outside += 1
    assert outside == 0
