"""The resizable thread pool (workers/pool.py) on its own: what an operator's or Flower's command can do to it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from agentfleet.workers.pool import MAX_THREADS, ResizableThreadPool


@pytest.fixture
def pool() -> Iterator[ResizableThreadPool]:
    started = ResizableThreadPool(limit=2)
    started.start()
    yield started
    started.stop()


def test_grow_and_shrink_take_only_a_positive_count_and_never_go_past_the_bounds(pool: ResizableThreadPool) -> None:
    for bad in (0, -3):  # `celery control pool_grow -3`, Flower's API with n=-3
        with pytest.raises(ValueError):
            pool.grow(bad)
        with pytest.raises(ValueError):
            pool.shrink(bad)
    assert pool.num_processes == 2
    with pytest.raises(ValueError):
        pool.grow(MAX_THREADS)  # a million threads would take the worker down
    with pytest.raises(ValueError):
        pool.shrink(2)  # one thread remains
    assert pool.num_processes == 2 and pool.info["max-concurrency"] == 2
    pool.grow(3)
    assert pool.num_processes == 5


def test_shrinking_never_interrupts_a_running_task(pool: ResizableThreadPool) -> None:
    gate = threading.Event()
    done: list[object] = []
    results = [pool.apply_async(gate.wait, (10,), callback=done.append) for _ in range(2)]
    pool.shrink(1)
    assert pool.num_processes == 1
    gate.set()
    for result in results:
        result.wait(10)
    assert done == [True, True]  # both ran to the end
    ran: list[object] = []
    pool.apply_async(lambda: "again", callback=ran.append).wait(10)
    assert ran == ["again"]  # the one thread left still works


def test_stopping_cancels_queued_tasks_and_lets_the_running_one_finish() -> None:
    pool = ResizableThreadPool(limit=1)
    pool.start()
    gate, started = threading.Event(), threading.Event()
    finished: list[object] = []

    def work() -> bool:
        started.set()
        return gate.wait(10)

    running = pool.apply_async(work, callback=finished.append)
    queued = pool.apply_async(lambda: "never", callback=finished.append)
    assert started.wait(10)
    threading.Timer(0.2, gate.set).start()
    pool.stop()
    running.wait(10)
    assert finished == [True] and queued.f.cancelled()


def _switches(native_id: int | None) -> int:
    with open(f"/proc/self/task/{native_id}/status") as status:
        return int(status.read().split("voluntary_ctxt_switches:")[1].split()[0])


@pytest.mark.alone  # a busy machine makes threads wait for the interpreter's lock: more switches, none of them wakes
def test_a_task_wakes_the_one_thread_that_runs_it_not_every_idle_one() -> None:
    """A thread woken for nothing costs a context switch, ~0.1 ms of CPU on this project's VMs (benchmarks/
    README.md). On one ``SimpleQueue`` every idle thread was woken for each task: with four threads, each switched
    ~0.9 times a task while running a quarter of them."""
    pool = ResizableThreadPool(limit=4)
    pool.start()
    try:
        ran: dict[int | None, int] = {}

        def note() -> None:
            me = threading.get_native_id()
            ran[me] = ran.get(me, 0) + 1

        pool.apply_async(note).wait(10)
        threads = [t.native_id for t in pool._threads]
        before = {t: _switches(t) for t in threads}
        for _ in range(400):
            pool.apply_async(note).wait(10)
        woken = sum(_switches(t) - before[t] for t in threads)
        # The thread that runs a task wakes once for it, and perhaps once more for the interpreter's lock.
        assert woken <= 2.5 * 400, (woken, ran)
    finally:
        pool.stop()
