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
* a guard beside the tool (``guarded``): ``--die-with-parent`` binds each of bubblewrap's processes
  only once it has called ``prctl``, and a worker killed (or a call cancelled) before that left the
  sandbox's init running the tool for as long as it liked. The guard, a shell in the sandbox's PID
  namespace, waits on the call's lifeline and kills every process in the namespace when it reads
  EOF: the call is over, or the worker is gone, at whatever moment it went;
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentfleet.sandbox.call_bounds import CallBounds, call_bounds
from agentfleet.sandbox.options import ResourceLimits, Sandbox

WORKDIR = "/sandbox/work"  # the call's private writable directory, as the tool sees it
TOOLDIR = "/sandbox/tool"  # the tool's own directory, read-only
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
MERGED_LINKS = ("/bin", "/lib", "/lib64", "/lib32", "/sbin")  # links into /usr on merged-/usr systems
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
SUPPORT_TTL_S = 30.0  # how long one probe of bubblewrap counts in a process
GUARD_NAME = "agentfleet-sandbox-guard"  # $0 of the guard's shell, as the process table shows it
GUARD_PROCESSES = 1  # the guard's own process, added to what the tool may start
# The guard: a subshell (stdio to /dev/null: it must not hold the call's output open) that reads the lifeline
# until EOF, then SIGKILLs every process of the sandbox's PID namespace it may signal (all but init and itself);
# the shell itself becomes the tool. Only inside a PID namespace of the call's own is ``kill -1`` this narrow.
GUARD = '(exec </dev/null >/dev/null 2>&1; read -r _ < /proc/self/fd/{fd}; kill -KILL -1) & exec "$@"'


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
    return {"processes": limits.processes + GUARD_PROCESSES, "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s,
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


def guarded(command: Sequence[str], lifeline_fd: int) -> list[str]:
    """``command`` under the guard that ends the sandbox's processes when the lifeline on ``lifeline_fd`` reads
    EOF (the descriptor must be open, and readable by the call's uid, in bubblewrap's process)."""
    return ["/bin/sh", "-c", GUARD.format(fd=int(lifeline_fd)), GUARD_NAME, *command]


def tool_env(sandbox: Sandbox, worker_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tool's whole environment: the base, the names it passes through, the values it sets."""
    source = os.environ if worker_env is None else worker_env
    out = dict(BASE_ENV)
    out.update({name: source[name] for name in sandbox.pass_env if name in source})
    out.update(sandbox.env)
    return out


def sandbox_ready() -> str:
    """What the sandbox check runs: bubblewrap's probe, fresh; raises with why it cannot build a sandbox."""
    found = support(refresh=True)
    if not found.available:
        raise RuntimeError(found.detail)
    return found.detail

