"""File tools confined to the workspace: list, read, and count lines."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import Field

from agentfleet.errors import ErrorCode, ToolError
from agentfleet.harness.tool import ToolContext, tool

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache",
             ".pytest_cache", "build", "dist", ".agentfleet"}
MAX_LISTED = 200
MAX_FILES_COUNTED = 20_000


def _walk(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for entry in sorted(root.iterdir()):
        if entry.is_symlink():
            continue  # a link could point outside the workspace
        if entry.is_dir():
            if entry.name in SKIP_DIRS or entry.name.startswith(".") or entry.name.endswith(".egg-info"):
                continue
            yield from _walk(entry)
        elif entry.is_file():
            yield entry


def _existing(ctx: ToolContext, path: str) -> Path:
    target = ctx.resolve(path)
    if not target.exists():
        raise ToolError(f"{path!r} does not exist", code=ErrorCode.INVALID_ARGUMENTS,
                        hint="List the directory first to see what is there.")
    return target


def _rel(ctx: ToolContext, p: Path) -> str:
    return str(p.relative_to(ctx.workspace))


@tool(read_only=True, timeout_s=20)
def list_files(
    ctx: ToolContext, path: Annotated[str, Field(description="Directory, relative to the workspace")] = "."
) -> dict:
    """List the files under a directory of the workspace (hidden and build directories skipped)."""
    root = _existing(ctx, path)
    files = [_rel(ctx, f) for f in _walk(root)]
    return {"path": path, "count": len(files), "files": files[:MAX_LISTED], "truncated": len(files) > MAX_LISTED}


@tool(read_only=True, timeout_s=10)
def read_file(
    ctx: ToolContext,
    path: Annotated[str, Field(description="File, relative to the workspace")],
    max_chars: Annotated[int, Field(ge=1, le=20_000, description="How much of the file to return")] = 2_000,
) -> dict:
    """Read the beginning of a text file in the workspace."""
    target = _existing(ctx, path)
    if not target.is_file():
        raise ToolError(f"{path!r} is not a file", code=ErrorCode.INVALID_ARGUMENTS,
                        hint="Use list_files to find files.")
    raw = target.read_bytes()
    if b"\0" in raw[:4096]:
        raise ToolError(f"{path!r} is a binary file", code=ErrorCode.INVALID_ARGUMENTS,
                        hint="Only text files can be read.")
    text = raw.decode("utf-8", errors="replace")
    return {"path": path, "chars": len(text), "text": text[:max_chars], "truncated": len(text) > max_chars}


@tool(read_only=True, timeout_s=30)
def count_lines(
    ctx: ToolContext, path: Annotated[str, Field(description="File or directory, relative to the workspace")] = "."
) -> dict:
    """Count the lines of the text files under a path, in total and by file extension."""
    root = _existing(ctx, path)
    total = 0
    counted = 0
    by_ext: Counter[str] = Counter()
    largest = {"path": None, "lines": 0}
    for f in _walk(root):
        if counted >= MAX_FILES_COUNTED:
            break
        raw = f.read_bytes()
        if b"\0" in raw[:4096]:
            continue
        lines = raw.count(b"\n") + (1 if raw and not raw.endswith(b"\n") else 0)
        counted += 1
        total += lines
        by_ext[f.suffix or "(none)"] += lines
        if lines > largest["lines"]:
            largest = {"path": _rel(ctx, f), "lines": lines}
    return {"path": path, "files": counted, "total_lines": total, "by_extension": dict(by_ext.most_common()),
            "largest": largest}
