"""Bare Celery: three chained no-op tasks on three queues, the floor for three hops on this broker; and the same
chain with one Postgres ``INSERT … COMMIT`` per hop, the floor for three *durable* hops.

Each set of floor workers has queues of its own (``FLOOR_QUEUES``), so a bare floor and a committing one can be up
at once and their chains run in turns with the fleet's iterations (``suites/overhead.py``): figures taken in the same
minute, not minutes apart on a machine whose speed drifts.

The worker processes load this module (``celery -A benchmarks.celery_floor``); the suites drive
them through :func:`floor_workers`. Same settings as the fleet where they matter: late acks,
prefetch 1, publisher confirms, the thread pool; with ``commit_url``, the fleet's own engine
(``make_engine``: same driver, same pool) on the same database server, one transaction per hop
committed before the next hop is sent, as a durable step would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery
from kombu import Queue
from sqlalchemy import Engine, text

from agentfleet.store.db import make_engine

BROKER = os.environ.get("AGENTFLEET_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS = os.environ.get("AGENTFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parents[1]
QUEUES = tuple(f"{os.environ.get('FLOOR_QUEUES', 'floor')}.q{hop}" for hop in (1, 2, 3))  # this worker's
COMMIT_URL = os.environ.get("FLOOR_COMMIT_URL")  # set: each hop commits one row before it hands on
HOPS_TABLE = "floor_hops"

app = Celery("floor", broker=BROKER)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_ignore_result=True,
                broker_transport_options={"confirm_publish": True}, worker_hijack_root_logger=False)
# redis-py 8 defaults to a 5 s socket timeout, shorter than the BLPOPs below wait.
_redis = redis.Redis.from_url(REDIS, socket_timeout=300)


_engine: Engine | None = None
_engine_guard = threading.Lock()


def _commit(key: str, hop: int) -> None:
    """One row, one transaction, committed: what the least durable step would write."""
    global _engine
    if COMMIT_URL is None:
        return
    if _engine is None:
        with _engine_guard:
            if _engine is None:
                _engine = make_engine(COMMIT_URL)
    with _engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {HOPS_TABLE} (chain, hop) VALUES (:chain, :hop)"), {"chain": key, "hop": hop})


def create_hops_table(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {HOPS_TABLE} (id BIGSERIAL PRIMARY KEY, chain TEXT NOT NULL, "
                          "hop INTEGER NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())"))
    engine.dispose()


@app.task(name="floor.hop1")
def hop1(t0: float, key: str) -> None:
    _commit(key, 1)
    hop2.apply_async((t0, key), queue=QUEUES[1])


@app.task(name="floor.hop2")
def hop2(t0: float, key: str) -> None:
    _commit(key, 2)
    hop3.apply_async((t0, key), queue=QUEUES[2])


@app.task(name="floor.hop3")
def hop3(t0: float, key: str) -> None:
    _commit(key, 3)
    _redis.rpush(key, time.time() - t0)


@dataclass
class Floor:
    key: str
    queues: tuple[str, ...]
    pids: tuple[int, ...] = ()  # its worker processes

    def chain_ms(self, count: int, timeout: float = 30) -> list[float]:
        """``count`` chains one at a time: milliseconds from send to the third hop's end, each."""
        out = []
        for _ in range(count):
            hop1.apply_async((time.time(), self.key), queue=self.queues[0])
            got = _redis.blpop([self.key], timeout=timeout)
            if got is None:
                raise TimeoutError(f"a bare Celery chain did not complete in {timeout:g} s")
            out.append(float(got[1]) * 1000)
        return out

    def burst_per_s(self, count: int) -> float:
        """``count`` chains sent at once: completed chains per second, send of the first to end of the last."""
        _redis.delete(self.key)
        t0 = time.time()
        with app.producer_or_acquire() as producer:
            for _ in range(count):
                hop1.apply_async((t0, self.key), queue=self.queues[0], producer=producer)
        deadline = time.monotonic() + 60 + count / 10
        while _redis.llen(self.key) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare Celery burst: {_redis.llen(self.key)}/{count} chains completed")
            time.sleep(0.01)
        longest = max(float(v) for v in _redis.lrange(self.key, 0, -1))
        _redis.delete(self.key)
        return count / longest


@contextmanager
def floor_workers(per_queue: int = 1, concurrency: int = 1, commit_url: str | None = None) -> Iterator[Floor]:
    """``per_queue`` thread-pool worker processes on each of the three queues, warmed up; with ``commit_url``,
    each hop commits one row to that database first (the table is made here)."""
    procs = []
    name = f"floor.{uuid.uuid4().hex[:8]}"
    queues = tuple(f"{name}.q{hop}" for hop in (1, 2, 3))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTFLEET_BROKER_URL": BROKER, "AGENTFLEET_REDIS_URL": REDIS,
           "FLOOR_QUEUES": name}
    env.pop("FLOOR_COMMIT_URL", None)
    if commit_url is not None:
        create_hops_table(commit_url)
        env["FLOOR_COMMIT_URL"] = commit_url
    with tempfile.TemporaryDirectory() as tmp:
        for queue in queues:
            for _ in range(per_queue):
                node = f"floor.{uuid.uuid4().hex[:8]}@%h"
                log = (Path(tmp) / f"{node}.log").open("wb")
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "benchmarks.celery_floor", "worker", "-Q", queue, "-n", node,
                     "-P", "threads", "-c", str(concurrency), "-l", "WARNING", "--without-mingle", "--without-gossip"],
                    env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        floor = Floor(f"afbench:floor:{uuid.uuid4().hex}", queues, tuple(p.pid for p in procs))
        with app.connection_for_write() as conn:
            # Declared here, not left to the first publish: kombu remembers what a process has
            # declared, so after an earlier floor deleted the queues a publish would not redeclare.
            for queue in queues:
                Queue(queue, durable=True).bind(conn.default_channel).declare()
        try:
            floor.chain_ms(1, timeout=120)  # waits for the workers to come up
            for _ in range(per_queue * 2):
                floor.chain_ms(1)
            yield floor
        finally:
            _redis.delete(floor.key)
            for p in procs:  # killed: nothing of theirs outlives the floor, and a bare Celery worker's warm stop
                p.kill()      # waits for its loop's next timer (1.5-2 s), which the fleet's workers no longer do
            for p in procs:
                p.wait(timeout=15)
            with app.connection_for_write() as conn:  # leave the broker as it was found
                for queue in queues:
                    conn.default_channel.queue_delete(queue)
