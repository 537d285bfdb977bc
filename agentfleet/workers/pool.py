"""The fleet's default execution pool: Celery's thread pool, made resizable while it runs.

Celery's ``threads`` pool is a fixed ``ThreadPoolExecutor``: ``pool_grow``, autoscale
and Flower's pool buttons fail on it (``'TaskPool' object has no attribute 'grow'``),
and only prefork could be scaled. Threads suit the fleet best (handlers wait on the
model, tools and the database; roles.py has the measurement), so this pool keeps
them and adds what Celery's resizing needs: ``grow``, ``shrink``, ``num_processes``.

Shrinking never interrupts a task: it queues one stop mark per thread to retire, and
a thread takes one only when it is free. Celery lowers the consumer's prefetch by
the same amount, so no more tasks are taken than the new size can run.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from celery.concurrency.base import BasePool, apply_target
from celery.concurrency.thread import ApplyResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Job:
    future: Future[Any]
    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    callback: Callable[..., Any] | None
    accept_callback: Callable[..., Any] | None


_RETIRE = None  # a stop mark: the thread that takes it ends
# A remote command (``pool_grow``, Flower's API) may ask for any number: past this, a worker would be
# taken down by its own threads' stacks, not scaled.
MAX_THREADS = 512


class ResizableThreadPool(BasePool):
    body_can_be_buffer = True
    signal_safe = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # queue.Queue, not SimpleQueue: a put on a SimpleQueue several threads wait on wakes them all, each for a
        # context switch (~0.1 ms of CPU on a busy two-core VM); Queue's condition wakes one waiter. Measured with
        # four threads: 5.2 against 3.6 switches a task (benchmarks/README.md).
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._threads: set[threading.Thread] = set()
        self._guard = threading.Lock()
        self._size = 0
        self._started = 0

    # -- Celery's pool interface ---------------------------------------------------

    def on_start(self) -> None:
        self.grow(int(self.limit or 1))

    def on_stop(self) -> None:
        """Like the thread pool's ``shutdown(cancel_futures=True)``: queued tasks are cancelled, running ones end."""
        with self._guard:
            threads = list(self._threads)
            self._size = 0
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.cancel()
        for _ in threads:
            self._jobs.put(_RETIRE)
        for thread in threads:
            thread.join()
        super().on_stop()

    def on_apply(self, target: Callable[..., Any], args: tuple[Any, ...] | None = None,
                 kwargs: dict[str, Any] | None = None, callback: Callable[..., Any] | None = None,
                 accept_callback: Callable[..., Any] | None = None, **_: Any) -> ApplyResult:
        future: Future[Any] = Future()
        self._jobs.put(_Job(future, target, tuple(args or ()), dict(kwargs or {}), callback, accept_callback))
        return ApplyResult(future)

    def grow(self, n: int = 1) -> None:
        with self._guard:
            if n < 1 or self._size + n > MAX_THREADS:
                raise ValueError(f"cannot grow a pool of {self._size} by {n}: 1 to {MAX_THREADS - self._size} more")
            for _ in range(n):
                self._started += 1
                thread = threading.Thread(target=self._work, name=f"agentfleet-pool-{self._started}", daemon=True)
                self._threads.add(thread)
                thread.start()
            self._size += n
            self.limit = self._size
        log.info("pool grown by %d to %d", n, self._size)

    def shrink(self, n: int = 1) -> None:
        with self._guard:
            if n < 1 or n >= self._size:
                raise ValueError(f"cannot shrink a pool of {self._size} by {n}: 1 to {self._size - 1} fewer, "
                                 "one thread must remain")
            self._size -= n
            self.limit = self._size
            for _ in range(n):
                self._jobs.put(_RETIRE)
        log.info("pool shrunk by %d to %d", n, self._size)

    def maintain_pool(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to replace: a thread does not die with the task it runs."""

    @property
    def num_processes(self) -> int:
        return self._size

    def _get_info(self) -> dict[str, Any]:
        info = super()._get_info()
        with self._guard:
            info.update({"max-concurrency": self._size, "threads": len(self._threads)})
        return info

    # -- the threads -----------------------------------------------------------------

    def _work(self) -> None:
        try:
            while (job := self._jobs.get()) is not _RETIRE:
                assert job is not None
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    job.future.set_result(apply_target(job.target, job.args, job.kwargs, job.callback,
                                                       job.accept_callback))
                except BaseException as exc:
                    job.future.set_exception(exc)
        finally:
            with self._guard:
                self._threads.discard(threading.current_thread())
