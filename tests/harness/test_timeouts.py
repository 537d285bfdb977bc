"""Calls with a timeout run on kept threads: a finished call's thread serves the next, an abandoned one never does,
and a forked child (a prefork pool's) does not wait on its parent's threads."""

from __future__ import annotations

import os
import threading
import time

from agentfleet.harness.timeouts import call_with_timeout


def test_a_thread_that_finished_in_time_serves_the_next_call_and_each_call_gets_a_fresh_context() -> None:
    import contextvars

    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")

    def first() -> int:
        seen.set("first call")
        return threading.get_ident()

    one = call_with_timeout(first, 5, name="a")
    two = call_with_timeout(lambda: (threading.get_ident(), seen.get()), 5, name="b")
    assert one.finished and two.finished
    assert two.value == (one.value, "unset")  # the same thread, none of the first call's context


def test_a_thread_abandoned_at_its_timeout_is_never_handed_another_call() -> None:
    release = threading.Event()
    hung = call_with_timeout(lambda: release.wait(10), 0.05, name="hangs")
    assert not hung.finished and hung.thread is not None and hung.thread.is_alive()
    after = call_with_timeout(threading.get_ident, 5, name="after")
    assert after.finished and after.value != hung.thread.ident
    release.set()
    hung.thread.join(5)
    assert not hung.thread.is_alive(), "it ends with its call"


def test_an_error_raised_by_the_call_comes_back_as_its_error() -> None:
    called = call_with_timeout(lambda: 1 / 0, 5, name="raises")
    assert called.finished and isinstance(called.error, ZeroDivisionError)


def test_a_forked_child_does_not_wait_on_its_parents_idle_threads() -> None:
    assert call_with_timeout(lambda: 1, 5, name="leaves one idle").finished  # the parent keeps a thread idle
    pid = os.fork()
    if pid == 0:  # the child: its first call must not go to a thread that does not exist here
        started = time.monotonic()
        called = call_with_timeout(lambda: 2, 3.0, name="in the child")
        os._exit(0 if called.finished and called.value == 2 and time.monotonic() - started < 1.0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
