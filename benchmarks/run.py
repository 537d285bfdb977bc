"""``agentfleet bench``: figures, side by side, on this machine. Not a test: nothing here asserts a speed.

Each suite starts what it measures (real worker processes over RabbitMQ, a scratch
Postgres database, a private broker namespace) and tears it down.
"""

from __future__ import annotations

import itertools
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from kombu import Connection
from sqlalchemy import text

import agentfleet
from agentfleet import constants as C
from agentfleet.events.topology import Topology
from agentfleet.store import Store, make_engine
from agentfleet.store.db import scratch_database
from agentfleet.workers.client import FleetClient
from agentfleet.workers.processes import WorkerProcesses
from agentfleet.workers.progress import wait_for_end

ROOT = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("AGENTFLEET_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
PG_ADMIN = os.environ.get("AGENTFLEET_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("AGENTFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class Sizes:
    overhead_iterations: int = 200
    floor_chains: int = 200
    growth_iterations: int = 200
    growth_turn_chars: int = 4000  # about 1,000 tokens
    recovery_kills: int = 20

    @classmethod
    def quick(cls) -> Sizes:
        return cls(overhead_iterations=40, floor_chains=40, growth_iterations=40, recovery_kills=3)

    @classmethod
    def tiny(cls) -> Sizes:
        return cls(overhead_iterations=3, floor_chains=3, growth_iterations=4, growth_turn_chars=100, recovery_kills=1)


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, suite: str, metric: str, value: Any, shown: str | None = None) -> None:
        self.figures.setdefault(suite, {})[metric] = value
        self.rows.append((suite, metric, shown if shown is not None else str(value)))


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Fleet:
    env: dict[str, str]
    store: Store
    workers: WorkerProcesses

    def run(self, agent: str, goal_input: dict[str, Any], timeout: float = 600) -> str:
        body = {"agent": agent, "input": goal_input, "goal_id": uuid.uuid4().hex}
        with FleetClient(_settings(self.env)) as client:
            client.publish_goal(body)
            run_id = client.run_id(body)
        if wait_for_end(self.store, run_id, timeout_s=timeout) is None:
            raise TimeoutError(f"run {run_id} did not finish; logs in {self.workers.logdir}")
        return run_id


def _settings(env: dict[str, str]) -> agentfleet.Settings:
    return agentfleet.Settings(broker_url=env["AGENTFLEET_BROKER_URL"], database_url=env["AGENTFLEET_DATABASE_URL"],
                               namespace=env["AGENTFLEET_NAMESPACE"], agents=env["AGENTFLEET_AGENTS"])


@contextmanager
def fleet(roles: dict[str, int]) -> Iterator[Fleet]:
    """Worker processes (role → count) in a private namespace over a scratch database."""
    namespace = f"afbench-{uuid.uuid4().hex[:8]}"
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url, \
            tempfile.TemporaryDirectory() as tmp:
        env = {"AGENTFLEET_PROFILE": "distributed", "AGENTFLEET_BROKER_URL": BROKER, "AGENTFLEET_DATABASE_URL": url,
               "AGENTFLEET_NAMESPACE": namespace, "AGENTFLEET_AGENTS": "benchmarks.agents",
               "AGENTFLEET_WORKSPACE": tmp, "AGENTFLEET_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
        workers = WorkerProcesses(env, Path(tmp) / "logs", cwd=ROOT)
        engine = make_engine(url)
        try:
            for role, count in roles.items():
                for _ in range(count):
                    workers.start(role)
            workers.wait_ready()
            yield Fleet(env, Store(engine), workers)
        finally:
            workers.stop()
            engine.dispose()
            with Connection(BROKER) as conn:
                Topology(namespace).delete(conn)


ONE_EACH = {C.PLANNER: 1, C.EXECUTOR: 1, C.OBSERVER: 1}


def iteration_times_ms(store: Store, run_id: str) -> list[float]:
    """Plan-to-plan intervals: one full iteration (plan → tool → observe) each."""
    starts = sorted(s["started_at"] for s in store.steps(run_id) if s["kind"] == "plan")
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(starts)]


def suite_overhead(sizes: Sizes, report: Report) -> None:
    with fleet(ONE_EACH) as f:
        f.run("bench_loop", {"iterations": 5})  # warm-up: connections, imports, caches
        run_id = f.run("bench_loop", {"iterations": sizes.overhead_iterations + 1})
        ours = iteration_times_ms(f.store, run_id)
    floor = celery_floor_ms(sizes.floor_chains)
    ours_med, floor_med = statistics.median(ours), statistics.median(floor)
    report.add("overhead", "agentfleet_iteration_median_ms", round(ours_med, 2))
    report.add("overhead", "agentfleet_iteration_p99_ms", round(pct(ours, 0.99), 2))
    report.add("overhead", "bare_celery_3_hops_median_ms", round(floor_med, 2))
    report.add("overhead", "bare_celery_3_hops_p99_ms", round(pct(floor, 0.99), 2))
    report.add("overhead", "ratio_to_bare_celery", round(ours_med / floor_med, 2), f"{ours_med / floor_med:.1f}×")
    tenth = max(1, len(ours) // 10)
    early, late = statistics.median(ours[:tenth]), statistics.median(ours[-tenth:])
    report.add("overhead", "agentfleet_first_10pct_median_ms", round(early, 2))
    report.add("overhead", "agentfleet_last_10pct_median_ms", round(late, 2))
    report.add("overhead", "samples", {"agentfleet": len(ours), "bare_celery": len(floor)})


def celery_floor_ms(chains: int) -> list[float]:
    """Three worker processes (one per queue, thread pool like ours), chains sent one at a time."""
    from benchmarks import celery_floor

    procs = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTFLEET_BROKER_URL": BROKER, "AGENTFLEET_REDIS_URL": REDIS}
    with tempfile.TemporaryDirectory() as tmp:
        for i, queue in enumerate(("floor.q1", "floor.q2", "floor.q3")):
            log = (Path(tmp) / f"floor{i}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "benchmarks.celery_floor", "worker", "-Q", queue,
                 "-n", f"floor{i}.{uuid.uuid4().hex[:6]}@%h", "-P", "threads", "-c", "1", "-l", "WARNING",
                 "--without-mingle", "--without-gossip"],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        try:
            r = redis.Redis.from_url(REDIS)
            key = f"afbench:floor:{uuid.uuid4().hex}"
            celery_floor.hop1.apply_async((time.time(), key), queue="floor.q1")  # warm-up (waits for workers)
            r.blpop([key], timeout=60)
            out = []
            for _ in range(chains):
                celery_floor.hop1.apply_async((time.time(), key), queue="floor.q1")
                got = r.blpop([key], timeout=30)
                if got is None:
                    raise TimeoutError("bare Celery chain did not complete")
                out.append(float(got[1]) * 1000)
            r.delete(key)
            return out
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=15)


def suite_growth(sizes: Sizes, report: Report) -> None:
    with fleet(ONE_EACH) as f:
        run_id = f.run("bench_loop", {"iterations": sizes.growth_iterations,
                                      "turn_chars": sizes.growth_turn_chars})
        per_iter: dict[int, int] = {}
        with f.store.engine.connect() as conn:
            for table in ("steps", "messages", "observations"):
                rows = conn.execute(text(f"SELECT iteration, sum(pg_column_size(t.*)) FROM {table} t "
                                         "WHERE run_id = :r GROUP BY iteration"), {"r": run_id}).all()
                for iteration, size in rows:
                    per_iter[iteration] = per_iter.get(iteration, 0) + int(size)
            processed = conn.execute(text("SELECT coalesce(sum(pg_column_size(p.*)), 0) FROM processed_events p"))
            processed_bytes = int(processed.scalar_one())
        transcript = sum(len(m.model_dump_json()) for m in f.store.transcript(run_id))
    ordered = [per_iter[i] for i in sorted(per_iter)][:-1]  # the last iteration is the final answer
    tenth = max(1, len(ordered) // 10)
    first, last = statistics.mean(ordered[:tenth]), statistics.mean(ordered[-tenth:])
    stored = sum(per_iter.values()) + processed_bytes
    report.add("growth", "iterations", sizes.growth_iterations)
    report.add("growth", "bytes_per_iteration_first_10pct", round(first))
    report.add("growth", "bytes_per_iteration_last_10pct", round(last))
    report.add("growth", "last_over_first", round(last / first, 3), f"{last / first:.2f} (flat = 1.00)")
    report.add("growth", "stored_bytes_total", stored)
    report.add("growth", "transcript_bytes", transcript)
    report.add("growth", "stored_over_transcript", round(stored / transcript, 2), f"{stored / transcript:.2f}×")


def suite_recovery(sizes: Sizes, report: Report) -> None:
    gaps: list[float] = []
    with fleet({C.PLANNER: 1, C.EXECUTOR: 2, C.OBSERVER: 1}) as f:
        for _ in range(sizes.recovery_kills):
            body = {"agent": "bench_loop", "input": {"iterations": 2, "nap_s": 1.5}, "goal_id": uuid.uuid4().hex}
            with FleetClient(_settings(f.env)) as client:
                client.publish_goal(body)
                run_id = client.run_id(body)
            step = _wait_step(f.store, run_id, lambda s: s["status"] == "started")
            pid = f.workers.pid_of(step["worker"])
            assert pid is not None, step
            os.kill(pid, signal.SIGKILL)
            killed_at = datetime.now(UTC)
            again = _wait_step(f.store, run_id, lambda s: s["attempts"] >= 2)
            gaps.append((again["started_at"] - killed_at).total_seconds() * 1000)
            f.workers.start(C.EXECUTOR)  # keep two executors
            f.workers.wait_ready()
    report.add("recovery", "kills", len(gaps))
    report.add("recovery", "kill_to_rerun_median_ms", round(statistics.median(gaps), 1))
    report.add("recovery", "kill_to_rerun_p99_ms", round(pct(gaps, 0.99), 1))


def _wait_step(store: Store, run_id: str, ok: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in store.steps(run_id):
            if s["kind"] == "tool" and ok(s):
                return s
        time.sleep(0.005)
    raise TimeoutError(f"no tool step of {run_id} matched")


SUITES: dict[str, Callable[[Sizes, Report], None]] = {
    "overhead": suite_overhead,
    "growth": suite_growth,
    "recovery": suite_recovery,
}


def machine() -> dict[str, Any]:
    import celery
    import kombu
    import sqlalchemy

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "memory_gib": round(mem, 1), "python": platform.python_version(),
            "agentfleet": agentfleet.__version__, "celery": celery.__version__, "kombu": kombu.__version__,
            "sqlalchemy": sqlalchemy.__version__, "date": datetime.now(UTC).date().isoformat()}


def run(suites: list[str], sizes: Sizes) -> Report:
    report = Report()
    report.figures["machine"] = machine()
    for name in suites:
        SUITES[name](sizes, report)
    return report
