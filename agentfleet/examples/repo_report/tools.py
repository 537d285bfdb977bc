"""File tools confined to the workspace: list, read, and count lines."""

from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import Field

from agentfleet import ErrorCode, ToolContext, ToolError, tool

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache",
             ".pytest_cache", "build", "dist", ".agentfleet"}
MAX_LISTED = 200
MAX_FILES_COUNTED = 20_000


def _skip(name: str) -> bool:
    return name in SKIP_DIRS or name.startswith(".") or name.endswith(".egg-info")


# Read-only, so a re-run after a crash may run them again; not cached, as files change under them
# between runs (disk_usage shows the result cache).
@tool(read_only=True, cache_ttl_s=0, timeout_s=20)
def list_files(
    ctx: ToolContext, path: Annotated[str, Field(description="Directory, relative to the workspace")] = "."
) -> dict:
    """List the files under a directory of the workspace (hidden and build directories skipped)."""
    files = [entry.path for entry in ctx.files.walk(path, skip_dir=_skip)]
    return {"path": path, "count": len(files), "files": files[:MAX_LISTED], "truncated": len(files) > MAX_LISTED}


@tool(read_only=True, cache_ttl_s=0, timeout_s=10)
def read_file(
    ctx: ToolContext,
    path: Annotated[str, Field(description="File, relative to the workspace")],
    max_chars: Annotated[int, Field(ge=1, le=20_000, description="How much of the file to return")] = 2_000,
) -> dict:
    """Read the beginning of a text file in the workspace."""
    size = ctx.files.size(path)
    raw = ctx.files.read_bytes(path, limit=max(4096, 4 * max_chars))  # at most 4 bytes a character: enough
    if b"\0" in raw[:4096]:
        raise ToolError(f"{path!r} is a binary file", code=ErrorCode.INVALID_ARGUMENTS,
                        hint="Only text files can be read.")
    text = raw.decode("utf-8", errors="replace")
    return {"path": path, "bytes": size, "text": text[:max_chars],
            "truncated": len(text) > max_chars or len(raw) < size}


@tool(read_only=True, cache_ttl_s=0, timeout_s=30)
def count_lines(
    ctx: ToolContext, path: Annotated[str, Field(description="File or directory, relative to the workspace")] = "."
) -> dict:
    """Count the lines of the text files under a path, in total and by file extension."""
    total = 0
    counted = 0
    by_ext: Counter[str] = Counter()
    largest = {"path": None, "lines": 0}
    for entry in ctx.files.walk(path, skip_dir=_skip):
        if counted >= MAX_FILES_COUNTED:
            break
        lines, last, binary = 0, b"", False
        for i, chunk in enumerate(entry.chunks()):  # a chunk at a time: a huge file costs no memory
            if i == 0 and b"\0" in chunk[:4096]:
                binary = True
                break
            lines += chunk.count(b"\n")
            last = chunk[-1:]
        if binary:
            continue
        lines += 1 if last and last != b"\n" else 0
        counted += 1
        total += lines
        by_ext[PurePosixPath(entry.path).suffix or "(none)"] += lines
        if lines > largest["lines"]:
            largest = {"path": entry.path, "lines": lines}
    return {"path": path, "files": counted, "total_lines": total, "by_extension": dict(by_ext.most_common()),
            "largest": largest}
