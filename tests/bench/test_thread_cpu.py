"""``benchmarks.thread_cpu`` splits a process's CPU by thread: the main thread (a worker's consumer), threads alive
at the end (its pool), and threads that ended in between (the executor's tool calls). CPU time, not wall time."""

from __future__ import annotations

import os
import threading
import time

from benchmarks.thread_cpu import Threads


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_each_threads_cpu_lands_in_its_own_part() -> None:
    pid = os.getpid()
    go, burnt, stop = threading.Event(), threading.Event(), threading.Event()

    def kept() -> None:  # a pool thread: alive before and after, busy only in between
        go.wait()
        _burn(0.3)
        burnt.set()
        stop.wait()

    pool = threading.Thread(target=kept)
    pool.start()
    try:
        before = Threads.of(pid)
        go.set()
        _burn(0.2)  # the main thread's own
        ended = threading.Thread(target=_burn, args=(0.25,))  # starts and ends within the stretch
        ended.start()
        ended.join()
        gone = time.monotonic() + 10  # join() returns before the kernel lets go of the thread: on a busy machine it is
        while os.path.exists(f"/proc/{pid}/task/{ended.native_id}") and time.monotonic() < gone:  # still listed
            time.sleep(0.01)
        assert burnt.wait(10)
        got = Threads.of(pid).since(before, pid, 1)
    finally:
        go.set()
        stop.set()
        pool.join()
    assert 150 <= got["consumer"] <= 400, got
    assert 250 <= got["pool"] <= 450, got
    assert 200 <= got["ended"] <= 450, got
    assert got["total"] >= got["consumer"] + got["pool"] + got["ended"] - 20, got


def test_a_handlings_cpu_in_publishes_is_its_cpu_over_its_publishs_and_nothing_published_is_none() -> None:
    """``handling_times``' machine-independent figure: a version's handling CPU against another's, across runs on a
    machine whose speed drifts, is compared in units of the publish both share."""
    from benchmarks.handling_times import per_publish

    assert per_publish({"handling_cpu": 3.0, "publish_cpu": 0.5}) == 6.0
    assert per_publish({"handling_cpu": 3.0, "publish_cpu": 0.0}) == 0.0
