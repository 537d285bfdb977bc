"""One child process for one tool call: its input written, its output bounded, its end enforced.

The child leads a new session, so one ``killpg`` reaches everything it started in
its group; under bubblewrap the PID namespace catches the rest. At the deadline, or
when the call is cancelled, the group gets SIGTERM and, ``grace_s`` later, SIGKILL:
a tool that ignores SIGTERM ends anyway. stdout is read up to a cap (a tool that
floods it is stopped, not buffered without end) and stderr keeps only its tail.
Side channels (pipes the child inherits: a tool's events, the files it keeps) are read
in the same loop, each into its own sink and up to its own cap. A lifeline (a pipe whose
write end only this process holds) tells what runs inside that the call is over: it reads
EOF once the child has exited, the call is stopped, or this process is gone.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

KILL_GRACE_S = 0.5  # how long a process has after SIGTERM before SIGKILL
STDERR_KEPT = 4096  # bytes of stderr kept (its tail) for the message of a failure
SUBPROCESS_MAX_OUTPUT = 32 * 1024 * 1024  # the most stdout read from one call (more: stopped, RESPONSE_TOO_LARGE)
CANCEL_POLL_S = 0.2  # how often a running call looks for its run's cancellation


Stopped = Literal["timeout", "cancelled", "overflow"]
READ_CHUNK = 65536


@dataclass
class SideChannel:
    """A pipe the child writes beside stdout: what arrives goes to ``sink`` up to ``cap`` bytes; past it the
    rest is read and dropped (the child is not blocked), and ``overflowed`` says so."""

    sink: IO[bytes]
    cap: int
    read_fd: int = -1
    write_fd: int = -1
    received: int = 0
    overflowed: bool = False
    _open: bool = field(default=False, repr=False)

    def __enter__(self) -> SideChannel:
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, True)
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_write()
        if self._open:
            self._open = False
            with contextlib.suppress(OSError):
                os.close(self.read_fd)

    def close_write(self) -> None:
        """The parent's copy of the write end: closed once the child has its own, so EOF can arrive."""
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def take(self, chunk: bytes) -> None:
        room = self.cap - self.received
        if room > 0:
            self.sink.write(chunk[:room])
        self.received += len(chunk)
        self.overflowed = self.received > self.cap


@dataclass
class Lifeline:
    """A pipe whose write end only this process holds (never inherited) and whose read end the child gets.

    Whoever reads it inside sees EOF when the call is over (``cut``: the child has exited, or it was stopped)
    or when this process is gone, killed at any moment, with no window in between: the kernel closes a dead
    process's descriptors. The sandbox's guard waits on it to end whatever the call left (``bwrap.guarded``).
    """

    read_fd: int = -1
    write_fd: int = -1

    def __enter__(self) -> Lifeline:
        self.read_fd, self.write_fd = os.pipe()  # both close-on-exec: the read end is passed on by number
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()
        self.close_read()

    def cut(self) -> None:
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def close_read(self) -> None:
        """This process's copy of the read end: closed once the child has its own."""
        if self.read_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            self.read_fd = -1


@dataclass(frozen=True)
class Exited:
    """How the child ended: its status (negative: killed by that signal), what it printed, why we stopped it."""

    returncode: int
    stdout: bytes
    stderr_tail: bytes
    stopped: Stopped | None = None
    elapsed_s: float = 0.0

    @property
    def signal(self) -> int | None:
        """The signal that ended it, directly or as bubblewrap reports a signalled child (128 + n)."""
        if self.returncode < 0:
            return -self.returncode
        if self.returncode > 128 and self.returncode - 128 < signal.NSIG:
            return self.returncode - 128
        return None


def run_child(argv: Sequence[str], stdin: bytes, *, timeout_s: float, cancelled: Callable[[], bool] | None = None,
              max_stdout: int = SUBPROCESS_MAX_OUTPUT, grace_s: float = KILL_GRACE_S,
              poll_s: float = CANCEL_POLL_S, cwd: str | None = None, env: Mapping[str, str] | None = None,
              popen: Mapping[str, Any] | None = None, on_start: Callable[[int], None] | None = None,
              side: Sequence[SideChannel] = (), lifeline: Lifeline | None = None) -> Exited:
    """Run ``argv`` to its end or ours. Raises OSError only when it cannot be started at all. ``lifeline`` is
    cut as soon as the child has exited: whatever it left behind is then told the call is over."""
    started = time.monotonic()
    options = dict(popen or {})
    options["pass_fds"] = (*options.get("pass_fds", ()), *(c.write_fd for c in side),
                           *((lifeline.read_fd,) if lifeline else ()))
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, cwd=cwd, env=dict(env) if env is not None else None,
                                close_fds=True, **options)
    finally:
        for channel in side:
            channel.close_write()
        if lifeline is not None:
            lifeline.close_read()
    if on_start is not None:
        on_start(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), name=f"stdin:{proc.pid}", daemon=True)
    feeder.start()
    out, err = bytearray(), bytearray()
    stopped: Stopped | None = None
    deadline = started + timeout_s
    next_probe = started + poll_s
    exit_fd = _exit_fd(proc) if lifeline is not None else None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        for channel in side:
            sel.register(channel.read_fd, selectors.EVENT_READ, channel)
        if exit_fd is not None:
            sel.register(exit_fd, selectors.EVENT_READ, lifeline)
        while sel.get_map():
            if lifeline is not None and lifeline.write_fd >= 0 and exit_fd is None and proc.poll() is not None:
                lifeline.cut()  # no pidfd here: the exit is seen at the next poll
            now = time.monotonic()
            if now >= deadline:
                stopped = "timeout"
            elif cancelled is not None and now >= next_probe:
                next_probe = now + poll_s
                if cancelled():
                    stopped = "cancelled"
            if stopped:
                break
            for key, _ in sel.select(timeout=min(poll_s, max(0.0, deadline - now))):
                if key.data is lifeline:  # the child has exited: what it left is told, and ends
                    lifeline.cut()  # type: ignore[union-attr]
                    sel.unregister(key.fileobj)
                    continue
                chunk = os.read(key.fd, READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if isinstance(key.data, SideChannel):
                    key.data.take(chunk)
                    continue
                buf: bytearray = key.data
                buf.extend(chunk)
                if buf is err:
                    del err[:-STDERR_KEPT]
                elif len(out) > max_stdout:
                    stopped = "overflow"
            if stopped:
                break
    if stopped:
        _stop_group(proc, grace_s)
    else:
        try:  # output closed: the child is ending; its group may still hold stragglers
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = "timeout"
            _stop_group(proc, grace_s)
    _kill_group(proc.pid)  # a backgrounded grandchild of a finished tool goes too
    if lifeline is not None:
        lifeline.cut()
    if exit_fd is not None:
        os.close(exit_fd)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    feeder.join(1)
    return Exited(proc.returncode, bytes(out[: max_stdout + 1]), bytes(err), stopped,
                  round(time.monotonic() - started, 3))


def _exit_fd(proc: subprocess.Popen[bytes]) -> int | None:
    """A descriptor that becomes readable when ``proc`` exits (a pidfd), or None where the kernel has none."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None


def _feed(pipe: Any, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the tool did not read its input: its exit says the rest
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    _kill_group(proc.pid)
    proc.wait()


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, sig)
