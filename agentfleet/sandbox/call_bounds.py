"""Bounds per call, never per host: what one sandboxed call may use, enforced for that call alone.

rlimits count per *user* (``RLIMIT_NPROC`` counts every process of the uid across the
host) or per *process* (``RLIMIT_AS``): with every call running as ``nobody``, one call
forking 60 processes made every other call fail to start, and three 800 MB processes
passed a 1 GiB cap. So each call gets, from what the host offers (detected once,
reported by ``agentfleet health``):

* **a uid of its own** from a pool (a worker running as root): ``RLIMIT_NPROC`` then
  counts that call's processes only, and no call can signal or read another's;
* **a cgroup of its own** where the host lets this process make them (cgroup v1's
  ``pids`` and ``memory`` hierarchies, or a cgroup v2 tree with those controllers):
  ``pids.max`` bounds its processes and ``memory.max`` (v1: ``memory.limit_in_bytes``)
  the memory of all its processes together, its tmpfs pages included; when the call
  ends, whatever is left in it is killed and the cgroup removed (one a killed worker
  left behind, by the next worker to start on the host: ``Cgroups.sweep``);
* size-limited tmpfs for its work directory, ``/tmp`` and ``/dev/shm`` (in the sandbox's
  own mount namespace: no privilege needed, nothing written to the host's disk).

A bound the host does not offer is said so, never pretended. A call over a bound ends
``RESOURCE_LIMIT`` (``exceeded`` reads the cgroup's own counters); the others never notice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import random
import resource
import signal
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentfleet.sandbox.options import SANDBOX_MEMORY_MB, SANDBOX_PROCESSES

SANDBOX_UID_BASE = 1_900_000_000  # calls of a root worker run as uids from here (one per running call)
SANDBOX_UID_POOL = 4096
SANDBOX_FALLBACK_UID = 65534


log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CALLS_GROUP = "agentfleet-calls"  # beneath this process's own cgroup: one child per running call
WORKER_LEAF = "agentfleet-worker"  # cgroup v2: where this process moves so its cgroup may delegate controllers
KILL_WAIT_S = 2.0
UNOWNED_GROUP_S = 60.0  # a call group named without its worker's pid, empty this long, is a dead worker's
_PID_NS = os.stat("/proc/self/ns/pid").st_ino if os.path.exists("/proc/self/ns/pid") else 0  # whose pids names hold
Limits = tuple[int, int]  # (processes, memory bytes)


# ---------------------------------------------------------------------------------------------- uids


@dataclass(frozen=True)
class UidSlot:
    """A uid held for one call: the lock on its slot file is the claim (released if this process dies)."""

    uid: int
    fd: int

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class UidPool:
    """Distinct uids for concurrent calls on this host, shared by every worker process on it.

    A slot is a file in a directory only this (root) user may write; a call holds an exclusive
    ``flock`` on one for as long as it runs. The kernel drops the lock when the holder exits,
    so a killed worker's slots come back by themselves."""

    def __init__(self, directory: Path, base: int = SANDBOX_UID_BASE, size: int = SANDBOX_UID_POOL) -> None:
        self.directory = directory
        self.base = base
        self.size = size

    def claim(self) -> UidSlot | None:
        """A free uid, or None when every slot is held (the caller then waits or refuses)."""
        start = random.randrange(self.size)
        dirfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for i in range(self.size):
                slot = (start + i) % self.size
                fd = os.open(f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dirfd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                return UidSlot(self.base + slot, fd)
        finally:
            os.close(dirfd)
        return None


def private_directory(path: Path) -> Path:
    """``path`` as a directory of this user's alone (mode 0700), made if missing; refused (OSError) when it is a
    link, belongs to another user or others may write it: a directory another user prepared is not ours."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise OSError(errno.EPERM, f"{path} is not a private directory of uid {os.geteuid()} (a link, another "
                                   "user's, or open to others)")
    return path


# ---------------------------------------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class CallGroup:
    """One call's cgroup directories (one per hierarchy), made before it starts and removed after."""

    dirs: tuple[Path, ...]
    version: int

    def join(self) -> None:
        """In the child, before it drops to the call's uid: move itself in (no locks, no logging here)."""
        for d in self.dirs:
            fd = os.open(d / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0" if self.version == 1 else str(os.getpid()).encode())
            finally:
                os.close(fd)

    def exceeded(self) -> list[str]:
        """The bounds the call ran into, read from the cgroup's own counters."""
        hit = []
        for d in self.dirs:
            if _counter(d / "pids.events", "max") > 0:
                hit.append("processes")
            if _counter(d / "memory.events", "oom_kill") > 0 or _counter(d / "memory.oom_control", "oom_kill") > 0:
                hit.append("memory")
        return hit

    def close(self) -> None:
        """Kill whatever of the call is still alive (a grandchild that left its session) and remove the group."""
        deadline = time.monotonic() + KILL_WAIT_S
        for d in self.dirs:
            if self.version == 2 and (d / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (d / "cgroup.kill").write_text("1")
            while True:
                pids = _pids(d)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    os.rmdir(d)
                    break
                except OSError as exc:
                    if time.monotonic() > deadline or exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                        log.warning("cgroup %s of a finished call could not be removed: %s", d, exc)
                        break
                    time.sleep(0.01)


class Cgroups:
    """Where this process makes one cgroup per call: one directory per hierarchy (v1: pids and memory;
    v2: one) beneath this process's own cgroup."""

    def __init__(self, parents: tuple[Path, ...], version: int) -> None:
        self.parents = parents
        self.version = version

    @property
    def how(self) -> str:
        return f"cgroup v{self.version}"

    def make(self, label: str, limits: Limits) -> CallGroup:
        """The call's group, named for the worker process that makes it (its PID namespace and pid), so that the
        next worker on the host knows a group whose worker is gone (``sweep``)."""
        processes, memory = limits
        name = f"{label[:40]}-{_PID_NS}.{os.getpid()}-{uuid.uuid4().hex[:12]}"
        made: list[Path] = []
        try:
            for parent in self.parents:
                d = parent / name
                os.mkdir(d, 0o755)
                made.append(d)
                if (d / "pids.max").exists():
                    (d / "pids.max").write_text(str(processes))
                if self.version == 2 and (d / "memory.max").exists():
                    (d / "memory.max").write_text(str(memory))
                    if (d / "memory.swap.max").exists():
                        (d / "memory.swap.max").write_text("0")
                if self.version == 1 and (d / "memory.limit_in_bytes").exists():
                    (d / "memory.limit_in_bytes").write_text(str(memory))
                    with contextlib.suppress(OSError):  # no swap accounting on this kernel: nothing to close
                        (d / "memory.memsw.limit_in_bytes").write_text(str(memory))
        except OSError:
            for d in made:
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        return CallGroup(tuple(made), self.version)

    def sweep(self) -> int:
        """Empty and remove the groups of calls whose worker is gone (killed mid-call: nothing ran its ``close``),
        their processes killed first; a group of a live worker is left alone. How many were removed."""
        stale: dict[str, list[Path]] = {}
        for parent in self.parents:
            try:
                children = [d for d in parent.iterdir() if d.is_dir()]
            except OSError:
                continue
            for d in children:
                if _left_behind(d):
                    stale.setdefault(d.name, []).append(d)
        for dirs in stale.values():
            CallGroup(tuple(dirs), self.version).close()
        return sum(1 for dirs in stale.values() if not any(d.exists() for d in dirs))


def _left_behind(group: Path) -> bool:
    """Whether a call's group outlived the worker that made it: its name's pid, of this PID namespace, is no live
    process (a group named before names held the pid: when it is empty and older than ``UNOWNED_GROUP_S``)."""
    parts = group.name.rsplit("-", 2)
    namespace, dot, pid = parts[1].partition(".") if len(parts) == 3 else ("", "", "")
    if dot and namespace.isdigit() and pid.isdigit():
        if int(namespace) != _PID_NS:
            return False  # a worker in another PID namespace (a container) sharing this cgroup: its pids not ours
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False  # alive, another user's
        return False
    try:
        return not _pids(group) and time.time() - group.stat().st_mtime > UNOWNED_GROUP_S
    except OSError:
        return False


def detect_cgroups(root: Path = CGROUP_ROOT, proc_self: Path = Path("/proc/self/cgroup")) -> Cgroups | str:
    """The cgroups this process may make per call, or why none: v1's pids and memory hierarchies where both
    are mounted and writable, else a v2 tree offering both controllers."""
    try:
        membership = proc_self.read_text()
    except OSError as exc:
        return f"cannot read {proc_self}: {exc}"
    own = {}
    for line in membership.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            own[c] = path
    problems = []
    if "pids" in own and "memory" in own:
        try:
            parents = tuple(_calls_parent(root / c, own[c]) for c in ("pids", "memory"))
            _probe(Cgroups(parents, 1))
            return Cgroups(parents, 1)
        except OSError as exc:
            problems.append(f"cgroup v1: {exc}")
    if "" in own:
        for mount in (root, root / "unified"):
            if _is_cgroup2(mount):
                try:
                    cg = Cgroups((_v2_calls_parent(mount, own[""]),), 2)
                    _probe(cg)
                    return cg
                except OSError as exc:
                    problems.append(f"cgroup v2 at {mount}: {exc}")
    return "; ".join(problems) or "no cgroup hierarchy with the pids and memory controllers is mounted"


def _calls_parent(mount: Path, own: str) -> Path:
    parent = mount / own.lstrip("/") / CALLS_GROUP
    parent.mkdir(exist_ok=True)
    if mount.name == "memory":
        with contextlib.suppress(OSError):
            (parent / "memory.use_hierarchy").write_text("1")
    return parent


def _is_cgroup2(mount: Path) -> bool:
    return (mount / "cgroup.controllers").exists() and not (mount / "tasks").exists()


def _v2_calls_parent(mount: Path, own: str) -> Path:
    """cgroup v2 keeps processes in leaves only: this process moves into a leaf of its own cgroup, which then
    hands the pids and memory controllers down to the calls' parent (fails if others share the cgroup)."""
    here = mount / own.lstrip("/")
    offered = (here / "cgroup.controllers").read_text().split()
    if not {"pids", "memory"} <= set(offered):
        raise OSError(errno.ENOTSUP, f"{here} does not offer the pids and memory controllers ({' '.join(offered)})")
    enabled = set((here / "cgroup.subtree_control").read_text().split())
    if not {"pids", "memory"} <= enabled:
        leaf = here / WORKER_LEAF
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (here / "cgroup.subtree_control").write_text("+pids +memory")
    parent = here / CALLS_GROUP
    parent.mkdir(exist_ok=True)
    if not {"pids", "memory"} <= set((parent / "cgroup.subtree_control").read_text().split()):
        (parent / "cgroup.subtree_control").write_text("+pids +memory")
    return parent


def _probe(cgroups: Cgroups) -> None:
    """Make and remove one call's cgroup: the detection is what a call will do."""
    cgroups.make("probe", (SANDBOX_PROCESSES, SANDBOX_MEMORY_MB << 20)).close()


def _counter(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _pids(d: Path) -> list[int]:
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


# ---------------------------------------------------------------------------------------------- the host


@dataclass(frozen=True)
class HostBounds:
    """What this host lets the fleet enforce per call, found once per process."""

    uids: UidPool | None
    cgroups: Cgroups | None
    uids_why_not: str = ""
    cgroups_why_not: str = ""

    def describe(self) -> dict[str, str]:
        """Which bound is enforced how (``agentfleet health``)."""
        cg = self.cgroups.how if self.cgroups else None
        own_uid = (f"a uid of its own per call ({self.uids.base}…{self.uids.base + self.uids.size - 1})"
                   if self.uids else None)
        processes = [f"{cg} pids.max per call"] if cg else []
        processes += [f"RLIMIT_NPROC on {own_uid}"] if own_uid else [
            f"RLIMIT_NPROC on the worker's own user, shared by its calls ({self.uids_why_not})"]
        return {
            "processes": "; ".join(processes),
            "memory": (f"{cg} memory limit on all of a call's processes together, and RLIMIT_AS per process" if cg
                       else f"RLIMIT_AS per process only ({self.cgroups_why_not})"),
            "work directory": "tmpfs of workdir_mb per call, in the sandbox (not the host's disk)",
            "/tmp": "tmpfs of tmp_mb per call, in the sandbox",
            "/dev/shm": "tmpfs of tmp_mb per call, in the sandbox",
            "cpu time": "RLIMIT_CPU per process",
            "file size": "RLIMIT_FSIZE per file",
            "leftover processes": ("the call's cgroup is emptied when it ends" if cg
                                   else "the sandbox's PID namespace ends with the call"),
        }


_host: HostBounds | None = None
_host_lock = threading.Lock()


def host_bounds() -> HostBounds:
    """Detected once per process, at the first sandboxed call (or ``agentfleet health``)."""
    global _host
    with _host_lock:
        if _host is None:
            _host = _detect()
            log.info("per-call bounds: %s", _host.describe())
        return _host


def _detect() -> HostBounds:
    uids: UidPool | None = None
    uids_why_not = ""
    if os.geteuid() == 0:
        try:
            uids = UidPool(private_directory(Path(tempfile.gettempdir()) / f"agentfleet-uids-{os.geteuid()}"))
            uids.claim().release()  # type: ignore[union-attr]
        except (OSError, AttributeError) as exc:
            uids, uids_why_not = None, f"no uid pool: {exc}"
    else:
        uids_why_not = "the worker is not root, so it cannot give calls uids of their own"
    found = detect_cgroups()
    if isinstance(found, str):
        return HostBounds(uids, None, uids_why_not, found)
    swept = found.sweep()
    if swept:
        log.info("removed %d call cgroups left by workers that are gone", swept)
    return HostBounds(uids, found, uids_why_not)


# ---------------------------------------------------------------------------------------------- one call


@dataclass
class CallBounds:
    """One call's share of the host: its uid, its cgroup, and the rlimits its processes start under."""

    uid: int
    gid: int
    group: CallGroup | None
    rlimits: tuple[tuple[int, int, int], ...]
    slot: UidSlot | None = None
    _closed: bool = field(default=False, repr=False)

    def preexec(self) -> None:
        """In the child between fork and exec, still as the worker's user: join the call's cgroup, set the
        rlimits, then drop to the call's uid (no locks, no logging)."""
        if self.group is not None:
            self.group.join()
        for which, soft, hard in self.rlimits:
            resource.setrlimit(which, (soft, hard))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(self.gid, self.gid, self.gid)
            os.setresuid(self.uid, self.uid, self.uid)

    def exceeded(self) -> list[str]:
        return self.group.exceeded() if self.group is not None else []

    def own(self, fd: int, *, read_only: bool = False) -> None:
        """Give a descriptor's file (a pipe) to the call's uid, so the call may open it by path; ``read_only``: for
        reading only (a pipe the call must not be able to hold open for writing, as it may any it was given)."""
        if os.geteuid() == 0:
            os.fchown(fd, self.uid, self.gid)
        os.fchmod(fd, 0o400 if read_only else 0o600)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.group is not None:
                self.group.close()
        finally:
            if self.slot is not None:
                self.slot.release()


@contextlib.contextmanager
def call_bounds(label: str, *, processes: int, memory_mb: int, cpu_s: int, open_files: int,
                file_size_mb: int, host: HostBounds | None = None) -> Iterator[CallBounds]:
    """The bounds of one call, released when it ends (its leftover processes killed)."""
    host = host or host_bounds()
    slot = host.uids.claim() if host.uids else None
    if host.uids and slot is None:
        raise OSError(errno.EAGAIN, f"all {host.uids.size} sandbox uids are in use on this host")
    if slot is not None:
        uid = gid = slot.uid
        nproc = processes
    else:
        uid, gid = _worker_or_nobody()
        # Not root: the tool runs as the worker's own user, whose processes and threads (the worker's among
        # them) all count against RLIMIT_NPROC; the tool gets its allowance on top of what runs now.
        nproc = processes + (tasks_of(uid) if os.geteuid() != 0 else 0)
    group = None
    try:
        if host.cgroups is not None:
            try:
                group = host.cgroups.make(label, (processes, memory_mb << 20))
            except OSError as exc:
                log.warning("no cgroup for this call (%s): its memory is bounded per process only", exc)
        if group is not None and slot is not None:
            nproc = 2 * processes  # pids.max trips first, and its counter says so (RLIMIT_NPROC is a backstop)
        rlimits = (
            (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),  # soft: SIGXCPU; hard: SIGKILL
            (resource.RLIMIT_AS, memory_mb << 20, memory_mb << 20),
            (resource.RLIMIT_NOFILE, open_files, open_files),
            (resource.RLIMIT_FSIZE, file_size_mb << 20, file_size_mb << 20),
            (resource.RLIMIT_NPROC, nproc, nproc),
            (resource.RLIMIT_CORE, 0, 0),
        )
        bounds = CallBounds(uid, gid, group, rlimits, slot)
    except BaseException:
        if group is not None:
            group.close()
        if slot is not None:
            slot.release()
        raise
    try:
        yield bounds
    finally:
        bounds.close()


def _worker_or_nobody() -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return SANDBOX_FALLBACK_UID, SANDBOX_FALLBACK_UID


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


PreExec = Callable[[], None]
