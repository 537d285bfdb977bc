"""The sandbox a subprocess tool runs in: bubblewrap namespaces, per-call bounds and a uid of its own.

Policy is what the tool declares (``Sandbox``), enforced here in code; the model
cannot talk its way past a namespace. What a tool sees:

* a new network namespace with only a loopback of its own, unless it declares ``network=True``
  (then it shares the host's network: bubblewrap cannot filter by address);
* a read-only root holding read-only system directories (``/usr``, ``/etc`` and the merged ``/bin``,
  ``/lib``), a private ``/proc`` and ``/dev``; its own directory read-only at ``/sandbox/tool``;
  nothing else of the worker's files (not the worker's home, not the workspace, not the project);
* a private writable work directory at ``/sandbox/work`` (its home and current directory), and
  private ``/tmp`` and ``/dev/shm``: each a size-limited tmpfs in the sandbox's own mount namespace,
  gone with the call; no byte of them reaches the host's disk;
* an environment cleared except ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` and what it declares; the
  values travel to bubblewrap through a file descriptor, never on a command line (``ps`` shows
  command lines to every local user);
* new PID, IPC, UTS and user namespaces: when bubblewrap's own process dies, every process the
  tool started dies with it (``--die-with-parent`` and the PID namespace's init), so a grandchild
  that left the process group cannot outlive the call;
* per-call bounds (``call_bounds``): a uid of its own, a cgroup of its own where the host offers
  one, and rlimits on CPU time, address space, open files, file size and processes.

Where bubblewrap cannot run, a sandboxed tool is refused (``TOOL_UNAVAILABLE``); it is never run
unsandboxed. (An opt-out, ``required = false``, ran tools bare with the worker's view: they could
read the worker's ``/proc/<pid>/environ`` and leave processes behind. It is gone.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentfleet import constants as C
from agentfleet.errors import ConfigurationError
from agentfleet.harness.call_bounds import CallBounds, call_bounds
from agentfleet.harness.health import HealthCheck, health_check

SANDBOX_ROOT = "/sandbox"  # where the call's own directories appear; no host path is shown beneath it
WORKDIR = "/sandbox/work"  # the call's private writable directory, as the tool sees it
TOOLDIR = "/sandbox/tool"  # the tool's own directory, read-only
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
MERGED_LINKS = ("/bin", "/lib", "/lib64", "/lib32", "/sbin")  # links into /usr on merged-/usr systems
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
SUPPORT_TTL_S = 30.0  # how long one probe of bubblewrap counts in a process


class ResourceLimits(BaseModel):
    """What one call may use, bounded for that call alone (``call_bounds`` says how this host enforces each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_s: int = Field(default=C.SANDBOX_CPU_S, ge=1, description="CPU seconds before SIGXCPU, then SIGKILL")
    memory_mb: int = Field(default=C.SANDBOX_MEMORY_MB, ge=16, description="Memory of all the call's processes "
                                                                         "together (and each one's address space)")
    open_files: int = Field(default=C.SANDBOX_OPEN_FILES, ge=8)
    file_size_mb: int = Field(default=C.SANDBOX_FILE_SIZE_MB, ge=1, description="Largest file it may write")
    processes: int = Field(default=C.SANDBOX_PROCESSES, ge=4, description="Processes of the call")
    tmp_mb: int = Field(default=C.SANDBOX_TMP_MB, ge=1, description="Size of its private /tmp and /dev/shm each")
    workdir_mb: int = Field(default=C.SANDBOX_WORKDIR_MB, ge=1, description="Size of its work directory")


class Sandbox(BaseModel):
    """What a subprocess tool may see and use. Unknown fields are configuration errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    network: bool = Field(default=False, description="Share the host's network (default: none at all)")
    env: dict[str, str] = Field(default_factory=dict, description="Variables set for the tool")
    pass_env: tuple[str, ...] = Field(default=(), description="Worker variables passed through by name")
    read_only: tuple[str, ...] = Field(default=(), description="More host paths visible read-only, same path")

    @field_validator("read_only")
    @classmethod
    def _outside_the_sandbox_dirs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not path.startswith("/") or path == "/" or path.startswith(SANDBOX_ROOT):
                raise ValueError(f"{path!r}: read_only paths are absolute host paths, not / and not under "
                                 f"{SANDBOX_ROOT}")
        return value
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    keep_workdir: bool = Field(default=False, description="Keep the work directory as an artifact after the call")
    required: bool = Field(default=True, description="Always true: a sandboxed tool never runs bare")

    @field_validator("required")
    @classmethod
    def _no_opt_out(cls, value: bool) -> bool:
        if not value:
            raise ValueError("required = false is no longer accepted: a tool run outside the sandbox could read the "
                             "worker's environment (/proc/<pid>/environ) and leave processes behind; a tool that "
                             "cannot run in the sandbox is refused (TOOL_UNAVAILABLE) instead")
        return value


@dataclass(frozen=True)
class Support:
    """Whether bubblewrap runs here, and why not."""

    available: bool
    detail: str


_support: tuple[float, str | None, Support] | None = None
_support_lock = threading.Lock()


def support(*, refresh: bool = False) -> Support:
    """Probe bubblewrap once per ``SUPPORT_TTL_S`` (or when which ``bwrap`` is found changes) by running
    ``true`` in the sandbox we would build."""
    global _support
    found_at = shutil.which("bwrap")
    with _support_lock:
        if (not refresh and _support is not None and _support[1] == found_at
                and time.monotonic() - _support[0] < SUPPORT_TTL_S):
            return _support[2]
        found = _probe()
        _support = (time.monotonic(), found_at, found)
        return found


def _probe() -> Support:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Support(False, "bubblewrap (bwrap) is not installed; install Debian's 'bubblewrap' package")
    box = Sandbox()
    try:
        with call_bounds("probe", **_bounds_of(box.limits)) as bounds, bwrap_args(box, None, BASE_ENV) as args:
            done = subprocess.run([bwrap, *args.argv, "--", "true"], capture_output=True, timeout=10, env={},
                                  preexec_fn=bounds.preexec, pass_fds=args.fds)
    except (OSError, subprocess.SubprocessError) as exc:
        return Support(False, f"bwrap could not start: {exc}")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return Support(False, f"bwrap cannot build a sandbox here: {err[-1] if err else f'exit {done.returncode}'}")
    return Support(True, "bubblewrap " + bwrap)


def _bounds_of(limits: ResourceLimits) -> dict[str, int]:
    return {"processes": limits.processes, "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s,
            "open_files": limits.open_files, "file_size_mb": limits.file_size_mb}


def bounds_for(label: str, limits: ResourceLimits) -> contextlib.AbstractContextManager[CallBounds]:
    """The per-call bounds (uid, cgroup, rlimits) of one call under ``limits``."""
    return call_bounds(label, **_bounds_of(limits))


@dataclass(frozen=True)
class BwrapArgs:
    """bubblewrap's options for one call: on its command line only ``--args FD`` (what they hold, the tool's
    environment among it, is read from a file descriptor: command lines are public on a host)."""

    argv: tuple[str, ...]
    fds: tuple[int, ...]


@contextlib.contextmanager
def bwrap_args(sandbox: Sandbox, tooldir: Path | None, env: Mapping[str, str]) -> Iterator[BwrapArgs]:
    """The options that build ``sandbox`` (the command follows ``--``), held in a memory file for the call."""
    options = sandbox_options(sandbox, tooldir, env)
    fd = os.memfd_create("agentfleet-bwrap-args", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"".join(o.encode("utf-8", "surrogateescape") + b"\0" for o in options))
        os.lseek(fd, 0, os.SEEK_SET)
        yield BwrapArgs(("--args", str(fd)), (fd,))
    finally:
        os.close(fd)


def sandbox_options(sandbox: Sandbox, tooldir: Path | None, env: Mapping[str, str]) -> list[str]:
    """bubblewrap's options for ``sandbox``. The private /tmp comes before the read-only paths, so a path
    shown beneath /tmp (a project checked out there) is not hidden by it."""
    limits = sandbox.limits
    cmd = ["--unshare-all", "--die-with-parent", "--new-session"]
    if sandbox.network:
        cmd.append("--share-net")
    for d in SYSTEM_DIRS:
        cmd += ["--ro-bind-try", d, d]
    for link in MERGED_LINKS:
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
        else:
            cmd += ["--ro-bind-try", link, link]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/dev/shm",
            "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    for path in sandbox.read_only:
        cmd += ["--ro-bind", path, path]
    if tooldir is not None:
        cmd += ["--ro-bind", str(tooldir), TOOLDIR]
    cmd += ["--size", str(limits.workdir_mb << 20), "--perms", "0700", "--tmpfs", WORKDIR,
            "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    for name, value in env.items():
        cmd += ["--setenv", name, value]
    return cmd


def tool_env(sandbox: Sandbox, worker_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tool's whole environment: the base, the names it passes through, the values it sets."""
    source = os.environ if worker_env is None else worker_env
    out = dict(BASE_ENV)
    out.update({name: source[name] for name in sandbox.pass_env if name in source})
    out.update(sandbox.env)
    return out


def sandbox_of(sandbox: Any, tool_name: str) -> Sandbox:
    """A tool's declared sandbox (``True``, a dict or a ``Sandbox``), or a ConfigurationError naming the fault."""
    try:
        return sandbox if isinstance(sandbox, Sandbox) else Sandbox.model_validate(
            {} if sandbox is True or not sandbox else sandbox)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigurationError(f"tool {tool_name!r}: its sandbox is invalid: "
                                 f"{f'{where}: ' if where else ''}{err['msg']}") from None


def sandbox_check() -> HealthCheck:
    """The health check every sandboxed tool shares by default: can bubblewrap build a sandbox here?"""
    return health_check(C.SANDBOX_CHECK, _sandbox_ready, tier="local", timeout_s=10)


def _sandbox_ready() -> str:
    found = support(refresh=True)
    if not found.available:
        raise RuntimeError(found.detail)
    return found.detail

