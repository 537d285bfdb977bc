"""Files beneath the workspace, opened so that a swapped symlink cannot lead outside it.

Checking a path and then opening it by name is a race: between the two, a directory
inside the workspace can be exchanged for a link to one outside (``renameat2`` with
RENAME_EXCHANGE does it atomically). Here every component is opened relative to the
descriptor of its parent with ``O_NOFOLLOW``, and directories are walked by descriptor,
so what is read is always what sits beneath the workspace at that moment. Symbolic links
are not followed at all; ``..`` is refused.

Hidden files and folders (a name starting with a dot: ``.env``, ``.git``, ``.ssh``) and
version-control folders are where secrets live: they are refused, and skipped by walks,
unless the tool opts in (``ctx.workspace_files(hidden=True)``). Reads are bounded: a tool
asks for at most so many bytes and never holds more of a file than that.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agentfleet.errors import ErrorCode, ToolError

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "CVS", "_darcs", ".jj"})
READ_CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ANY = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang the open


@dataclass(frozen=True)
class Entry:
    """A regular file met by ``walk``; readable while the walk is at it."""

    path: str  # relative to the workspace
    _dir_fd: int
    _name: str

    def size(self) -> int:
        """Bytes, from the entry itself (a link put in its place since the walk listed it is not followed)."""
        return os.stat(self._name, dir_fd=self._dir_fd, follow_symlinks=False).st_size

    def read_bytes(self, limit: int | None = None) -> bytes:
        """The file's content, or its first ``limit`` bytes."""
        fd = os.open(self._name, _ANY, dir_fd=self._dir_fd)
        try:
            return _read_regular(fd, self.path, limit)
        finally:
            os.close(fd)

    def chunks(self) -> Iterator[bytes]:
        """The file's content a chunk at a time (what counts lines holds one chunk, not the file)."""
        fd = os.open(self._name, _ANY, dir_fd=self._dir_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            while chunk := os.read(fd, READ_CHUNK):
                yield chunk
        finally:
            os.close(fd)


def hidden(name: str) -> bool:
    """Dotfiles and dot-folders, and version-control folders: not shown to tools unless they opt in."""
    return name.startswith(".") or name in VCS_DIRS


class Workspace:
    def __init__(self, root: Path, *, hidden: bool = False) -> None:
        self.root = root
        self.show_hidden = hidden

    def parts(self, relative: str) -> list[str]:
        """The path's components beneath the root; ``..``, absolute paths and (unless shown) hidden names are
        refused."""
        pure = PurePosixPath(relative)
        if pure.is_absolute() or ".." in pure.parts:
            raise ToolError(f"path {relative!r} is outside the workspace", code=ErrorCode.PERMISSION_DENIED,
                            hint="Use a path relative to the workspace root, without '..'.")
        parts = [p for p in pure.parts if p not in ("", ".")]
        if not self.show_hidden and any(hidden(p) for p in parts):
            raise ToolError(f"path {relative!r} is hidden (a dotfile or version-control folder); file tools do not "
                            "read those", code=ErrorCode.PERMISSION_DENIED,
                            hint="Use the project's own files; hidden files often hold secrets.")
        return parts

    @contextmanager
    def open(self, relative: str) -> Iterator[tuple[int, os.stat_result]]:
        """A descriptor for the file or directory at ``relative``, and its stat."""
        parts = self.parts(relative)
        fd = os.open(self.root, _DIR)
        try:
            for i, name in enumerate(parts):
                flags = _DIR if i < len(parts) - 1 else _ANY
                try:
                    child = os.open(name, flags, dir_fd=fd)
                except OSError as exc:
                    raise _refusal(relative, exc) from None
                os.close(fd)
                fd = child
            yield fd, os.fstat(fd)
        finally:
            os.close(fd)

    def read_bytes(self, relative: str, limit: int | None = None) -> bytes:
        """A file's content, or its first ``limit`` bytes (a 500 MB file read for ten characters reads ten)."""
        with self.open(relative) as (fd, st):
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(f"{relative!r} is not a file", code=ErrorCode.INVALID_ARGUMENTS,
                                hint="Use list_files to find files.")
            return _read_regular(fd, relative, limit)

    def size(self, relative: str) -> int:
        with self.open(relative) as (_fd, st):
            return st.st_size

    def walk(self, relative: str, skip_dir: Callable[[str], bool] = lambda _name: False) -> Iterator[Entry]:
        """The regular files under ``relative`` (itself, if it is one), in name order; links are skipped."""
        with self.open(relative) as (fd, st):
            base = "/".join(self.parts(relative))
            if stat.S_ISREG(st.st_mode):
                parent = "/".join(self.parts(relative)[:-1])
                yield from self._walk_file_itself(parent, base)
                return
            if not stat.S_ISDIR(st.st_mode):
                return
            skip = skip_dir if self.show_hidden else (lambda name: hidden(name) or skip_dir(name))
            yield from _walk_fd(fd, base, skip, self.show_hidden)

    def _walk_file_itself(self, parent: str, path: str) -> Iterator[Entry]:
        with self.open(parent or ".") as (dir_fd, _):
            yield Entry(path, dir_fd, PurePosixPath(path).name)


def _walk_fd(fd: int, base: str, skip_dir: Callable[[str], bool], show_hidden: bool) -> Iterator[Entry]:
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        path = f"{base}/{entry.name}" if base else entry.name
        if entry.is_symlink() or (not show_hidden and hidden(entry.name)):
            continue
        if entry.is_dir(follow_symlinks=False):
            if skip_dir(entry.name):
                continue
            try:
                child = os.open(entry.name, _DIR, dir_fd=fd)
            except OSError:
                continue  # swapped for a link, or gone, since it was listed
            try:
                yield from _walk_fd(child, path, skip_dir, show_hidden)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            yield Entry(path, fd, entry.name)


def _read_regular(fd: int, relative: str, limit: int | None = None) -> bytes:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ToolError(f"{relative!r} is not a regular file", code=ErrorCode.INVALID_ARGUMENTS)
    chunks, left = [], limit
    while left is None or left > 0:
        chunk = os.read(fd, READ_CHUNK if left is None else min(READ_CHUNK, left))
        if not chunk:
            break
        chunks.append(chunk)
        if left is not None:
            left -= len(chunk)
    return b"".join(chunks)


def _refusal(relative: str, exc: OSError) -> ToolError:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return ToolError(f"{relative!r} goes through a symbolic link; file tools do not follow links",
                         code=ErrorCode.PERMISSION_DENIED, hint="Use the real path inside the workspace.")
    if exc.errno == errno.ENOENT:
        return ToolError(f"{relative!r} does not exist", code=ErrorCode.INVALID_ARGUMENTS,
                         hint="List the directory first to see what is there.")
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"{relative!r}: a part of it is not a directory", code=ErrorCode.INVALID_ARGUMENTS)
    return ToolError(f"{relative!r} cannot be opened: {exc.strerror}", code=ErrorCode.PERMISSION_DENIED)
