"""The sandbox a subprocess tool runs in: bubblewrap namespaces, rlimits and an unprivileged user.

Policy is what the tool declares (``Sandbox``), enforced here in code; the model
cannot talk its way past a namespace. What a tool sees:

* a new network namespace with only a loopback of its own, unless it declares ``network=True``
  (then it shares the host's network: bubblewrap cannot filter by address);
* a read-only root holding read-only system directories (``/usr``, ``/etc`` and the merged ``/bin``,
  ``/lib``), a private ``/proc``, ``/dev`` and ``/tmp`` (gone with the call); its own directory
  read-only at ``/sandbox/tool``; a private writable work directory for the call at
  ``/sandbox/work``, which is its home and current directory; nothing else
  of the worker's files (not the worker's home, not the workspace, not the project);
* an environment cleared except ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` and what it declares;
* new PID, IPC, UTS and user namespaces: when bubblewrap's own process dies, every process the
  tool started dies with it (``--die-with-parent`` and the PID namespace's init), so a grandchild
  that left the process group cannot outlive the call;
* rlimits on CPU time, address space, open files, file size and processes, applied to an
  unprivileged uid: ``RLIMIT_NPROC`` does not bind root, so a worker running as root starts the
  sandbox as ``nobody``. cgroups would bound memory better but are not usable on every host.

Where bubblewrap cannot run, a tool that requires the sandbox is refused (``TOOL_UNAVAILABLE``);
it is never run unsandboxed silently. A tool may opt out (``required=False``) and then runs with
the same rlimits and user, but with the worker's view of the file system and network.
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentfleet import constants as C

SANDBOX_ROOT = "/sandbox"  # where the call's own directories appear; no host path is shown beneath it
WORKDIR = "/sandbox/work"  # the call's private writable directory, as the tool sees it
TOOLDIR = "/sandbox/tool"  # the tool's own directory, read-only
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
MERGED_LINKS = ("/bin", "/lib", "/lib64", "/lib32", "/sbin")  # links into /usr on merged-/usr systems
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
UNPRIVILEGED_USER = "nobody"
SUPPORT_TTL_S = 30.0  # how long one probe of bubblewrap counts in a process


class ResourceLimits(BaseModel):
    """rlimits for one call (each process of it, and processes counted per sandbox user)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_s: int = Field(default=C.SANDBOX_CPU_S, ge=1, description="CPU seconds before SIGXCPU, then SIGKILL")
    memory_mb: int = Field(default=C.SANDBOX_MEMORY_MB, ge=16, description="Address space per process")
    open_files: int = Field(default=C.SANDBOX_OPEN_FILES, ge=8)
    file_size_mb: int = Field(default=C.SANDBOX_FILE_SIZE_MB, ge=1, description="Largest file it may write")
    processes: int = Field(default=C.SANDBOX_PROCESSES, ge=4, description="Processes of the sandbox user")
    tmp_mb: int = Field(default=C.SANDBOX_TMP_MB, ge=1, description="Size of its private /tmp (memory)")


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
    required: bool = Field(default=True, description="Refuse to run where bubblewrap cannot (False: run with "
                                                     "rlimits only, with a warning)")


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
    with tempfile.TemporaryDirectory(prefix="agentfleet-probe-") as tmp:
        work = Path(tmp)
        uid, gid = sandbox_user()
        if os.geteuid() == 0:
            os.chown(work, uid, gid)
        argv = bwrap_argv(Sandbox(), work, None, ["true"], bwrap=bwrap)
        try:
            done = subprocess.run(argv, capture_output=True, timeout=10, **as_user(Sandbox().limits))
        except (OSError, subprocess.SubprocessError) as exc:
            return Support(False, f"bwrap could not start: {exc}")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return Support(False, f"bwrap cannot build a sandbox here: {err[-1] if err else f'exit {done.returncode}'}")
    return Support(True, "bubblewrap " + bwrap)


def sandbox_user() -> tuple[int, int]:
    """The uid and gid tools run as: ``nobody`` when the worker is root, else the worker's own."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return C.SANDBOX_FALLBACK_UID, C.SANDBOX_FALLBACK_UID


def bwrap_argv(sandbox: Sandbox, workdir: Path, tooldir: Path | None, argv: Sequence[str], *,
               bwrap: str = "bwrap", env: Mapping[str, str] | None = None) -> list[str]:
    """The bubblewrap command line that runs ``argv`` under ``sandbox``."""
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
    if sandbox.network:
        cmd.append("--share-net")
    for d in SYSTEM_DIRS:
        cmd += ["--ro-bind-try", d, d]
    for link in MERGED_LINKS:
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
        else:
            cmd += ["--ro-bind-try", link, link]
    for path in sandbox.read_only:
        cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(sandbox.limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    if tooldir is not None:
        cmd += ["--ro-bind", str(tooldir), TOOLDIR]
    cmd += ["--bind", str(workdir), WORKDIR, "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    for name, value in (env if env is not None else tool_env(sandbox)).items():
        cmd += ["--setenv", name, value]
    return [*cmd, "--", *argv]


def tool_env(sandbox: Sandbox, worker_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tool's whole environment: the base, the names it passes through, the values it sets."""
    source = os.environ if worker_env is None else worker_env
    out = dict(BASE_ENV)
    out.update({name: source[name] for name in sandbox.pass_env if name in source})
    out.update(sandbox.env)
    return out


def as_user(limits: ResourceLimits) -> dict[str, object]:
    """``subprocess.Popen`` keywords that start the child as the sandbox user under ``limits``."""
    uid, gid = sandbox_user()
    if os.geteuid() == 0:
        return {"preexec_fn": _rlimits(limits, limits.processes), "user": uid, "group": gid, "extra_groups": []}
    # Not root: the tool runs as the worker's own user, whose processes and threads (the worker's among
    # them) all count against RLIMIT_NPROC; the tool gets its allowance on top of what runs now.
    return {"preexec_fn": _rlimits(limits, limits.processes + tasks_of(os.getuid()))}


def tasks_of(uid: int) -> int:
    """Processes and threads of ``uid`` now (what RLIMIT_NPROC counts), read from /proc."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if line.startswith(("Uid:", "Threads:")))
        except (OSError, ValueError):
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _rlimits(limits: ResourceLimits, processes: int) -> Callable[[], None]:
    table = (
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),  # soft: SIGXCPU; hard: SIGKILL
        (resource.RLIMIT_AS, limits.memory_mb << 20, limits.memory_mb << 20),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_FSIZE, limits.file_size_mb << 20, limits.file_size_mb << 20),
        (resource.RLIMIT_NPROC, processes, processes),
        (resource.RLIMIT_CORE, 0, 0),
    )

    def apply() -> None:  # runs in the child between fork and exec: no locks, no logging
        for which, soft, hard in table:
            resource.setrlimit(which, (soft, hard))

    return apply


def make_workdir(root: Path, label: str) -> Path:
    """A fresh private directory for one call, owned by the sandbox user."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # others may pass through to their own directory, not list the others
    path = Path(tempfile.mkdtemp(prefix=f"{label[:40]}-", dir=root))
    if os.geteuid() == 0:
        uid, gid = sandbox_user()
        os.chown(path, uid, gid)
    os.chmod(path, 0o700)
    return path
