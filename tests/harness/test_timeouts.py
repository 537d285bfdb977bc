"""Calls with a timeout: each on a thread of its own (nothing one call leaves in its thread reaches another), an
abandoned one never handed another call, and a forked child (a prefork pool's) not waiting on its parent's threads."""

from __future__ import annotations

import os
import threading

from agentfleet.harness.timeouts import call_with_timeout


def test_what_one_call_leaves_in_its_thread_no_later_call_sees() -> None:
    """Calls of different runs share a process: state a library keeps per thread (``decimal``'s context,
    ``threading.local``, contextvars) set by one call must not reach the next, whoever's it is."""
    import contextvars
    import decimal

    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")
    local = threading.local()

    def first() -> None:
        seen.set("run A's value")
        local.secret = "run A's secret"
        decimal.getcontext().prec = 3

    assert call_with_timeout(first, 5, name="run A").finished
    second = call_with_timeout(lambda: (seen.get(), getattr(local, "secret", None), decimal.getcontext().prec), 5,
                               name="run B")
    assert second.finished and second.value == ("unset", None, decimal.DefaultContext.prec)


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
    if pid == 0:  # the child: its call must not go to a thread that does not exist here (it would time out)
        called = call_with_timeout(lambda: 2, 3.0, name="in the child")
        os._exit(0 if called.finished and called.value == 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
