"""Loaded by every worker of ``python -m benchmarks.handling_times`` (its directory goes first on their PYTHONPATH):
times each handling from inside the worker, unmodified otherwise.

Per handling (``run_event``, which Celery's tracer calls once per event): wall and CPU time of the whole handling,
of the time in psycopg's waits (every statement and pipeline goes through ``Connection.wait``; its CPU is the
client's, the rest is the database and the socket), of ``Publisher.publish`` (the broker's confirm included), and
the round trips to Postgres (a pipeline of deferred statements is one). Written as JSON lines at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any

if os.environ.get("AGENTFLEET_HANDLING_PROBE"):
    _rows: list[tuple[str, str, dict[str, float]]] = []
    _local = threading.local()

    def _add(key: str, wall: float, cpu: float) -> None:
        times = getattr(_local, "times", None)
        if times is not None:
            times[f"{key}_wall"] = times.get(f"{key}_wall", 0.0) + wall
            times[f"{key}_cpu"] = times.get(f"{key}_cpu", 0.0) + cpu
            times[f"{key}_n"] = times.get(f"{key}_n", 0.0) + 1

    def _timed(key: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                _add(key, time.perf_counter() - wall, time.thread_time() - cpu)
        return timed

    def _counted(fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            _add("round_trips", 0.0, 0.0)
            return fn(*args, **kwargs)
        return counted

    def _install(**_: Any) -> None:
        import psycopg

        from agentfleet.events import publisher
        from agentfleet.store import sql
        from agentfleet.workers import event_task

        handle = event_task.run_event

        def run_event(task: Any, raw: Any, carried: Any = None) -> Any:
            _local.times = times = {}
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return handle(task, raw, carried)
            finally:
                times["handling_wall"], times["handling_cpu"] = time.perf_counter() - wall, time.thread_time() - cpu
                _local.times = None
                _rows.append((task.role, raw.get("run_id", "") if isinstance(raw, dict) else "", times))

        event_task.run_event = run_event  # looked up by the registered tasks at each call
        psycopg.Connection.wait = _timed("database", psycopg.Connection.wait)
        publisher.Publisher.publish = _timed("publish", publisher.Publisher.publish)
        sql._round_trip = _counted(sql._round_trip)  # every round trip of the store's own statements

    def _dump() -> None:
        with open(os.path.join(os.environ["AGENTFLEET_HANDLING_PROBE"], f"{os.getpid()}.jsonl"), "w") as out:
            for row in _rows:
                out.write(json.dumps(row) + "\n")

    from celery.signals import worker_init

    worker_init.connect(_install, weak=False)
    atexit.register(_dump)
