"""Calling Python code with a timeout.

Python code cannot be killed from inside its process: it runs in a daemon thread
that is abandoned at its timeout. Tools and health checks both use this.

The threads are kept for the next call once a call finishes in time (starting a thread per call cost 46 µs of
CPU and 137 µs before the call began, on every tool call of every iteration). A thread still running at the
timeout is abandoned: it is never handed another call, and ends when (if) its call does. Each call runs in a
fresh ``contextvars`` context, as it did in a thread of its own.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IDLE_KEPT = 32  # threads kept waiting for calls; more than that end once their call is done


@dataclass(frozen=True)
class Called:
    finished: bool  # False: still running at the timeout, and abandoned (``thread`` says if it ever ends)
    value: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = None


class _Call:
    """One call handed to a thread, and what became of it. ``done`` is held until the call ends; whether it ended
    in time or was abandoned is settled under ``_settle`` (both sides may get there at once)."""

    __slots__ = ("abandoned", "done", "error", "finished", "fn", "name", "value")

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.done = threading.Lock()
        self.done.acquire()
        self.finished = False
        self.abandoned = False
        self.value: Any = None
        self.error: BaseException | None = None


_settle = threading.Lock()


class _CallThread:
    """A daemon thread running the calls it is handed, one at a time, until one outlives its timeout."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="agentfleet-call", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (call := self.calls.get()) is not None:
            self.thread.name = call.name
            try:
                call.value = contextvars.Context().run(call.fn)
            except BaseException as exc:  # the caller gets it, as it would from a thread of its own
                call.error = exc
            with _settle:
                call.finished = True
                abandoned = call.abandoned
            call.done.release()
            if abandoned:
                return  # its caller gave up on it: this thread is done


_idle: list[_CallThread] = []
_idle_lock = threading.Lock()


def _forget_threads() -> None:
    """In a forked child (a prefork pool's), the parent's idle threads do not exist: a call handed to one would
    wait out its whole timeout."""
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def call_with_timeout(fn: Callable[[], Any], timeout_s: float, *, name: str) -> Called:
    with _idle_lock:
        runner = _idle.pop() if _idle else None
    if runner is None:
        runner = _CallThread()
    call = _Call(fn, name)
    runner.calls.put(call)
    call.done.acquire(timeout=max(0.0, timeout_s))
    with _settle:
        if not call.finished:
            call.abandoned = True
            return Called(False, thread=runner.thread)
    with _idle_lock:
        keep = len(_idle) < IDLE_KEPT
        if keep:
            _idle.append(runner)
    if not keep:
        runner.calls.put(None)
    return Called(True, call.value, call.error, runner.thread)
