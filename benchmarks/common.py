"""What every suite shares: sizes, the report, a private fleet of worker processes, the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kombu import Connection
from sqlalchemy import Table, text

import agentfleet
from agentfleet import constants as C
from agentfleet.events.topology import Topology
from agentfleet.ops.client import FleetClient
from agentfleet.ops.progress import wait_for_end
from agentfleet.store import Store, make_engine
from agentfleet.store.db import scratch_database
from agentfleet.store.records import RunRecord
from agentfleet.workers.processes import WorkerProcesses

ROOT = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("AGENTFLEET_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
PG_ADMIN = os.environ.get("AGENTFLEET_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("AGENTFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
T = TypeVar("T")
ONE_EACH = {C.PLANNER: 1, C.EXECUTOR: 1, C.OBSERVER: 1}


@dataclass
class Sizes:
    overhead_iterations: int = 200
    floor_chains: int = 200
    peer_iterations: int = 200
    throughput_workers: tuple[int, ...] = (1, 2, 4)
    throughput_runs: int = 60
    throughput_iterations: int = 10
    floor_burst: int = 1000
    throughput_turns: int = 6  # bursts a side at each process count, the fleet's and Celery + commit's alternating
    growth_iterations: int = 200
    growth_turn_chars: int = 4000  # about 1,000 tokens
    long_run_iterations: int = 1000  # a plain run's first tenth timed against its last (issue 23)
    long_runs: int = 3  # so many such runs, their tenths pooled: one run's ratio is the VM's noise (suites/growth.py)
    recovery_kills: int = 20
    parked_runs: int = 10_000
    approval_runs: int = 1_000
    profile_iterations: int = 300
    waiting_parents: int = 200  # the figure: 200 parents waiting on slow children
    retention_runs: int = 10_000  # ended runs a prune deletes beside a load
    retention_load: int = 200
    schedule_minutes: float = 10.0
    schedule_every_s: int = 10
    console_runs: int = 100_000  # runs in the database while the console's pages are timed

    @classmethod
    def quick(cls) -> Sizes:
        return cls(overhead_iterations=40, floor_chains=40, peer_iterations=40, throughput_workers=(1, 2),
                   throughput_runs=16, throughput_iterations=5, floor_burst=200, throughput_turns=2,
                   growth_iterations=40, long_run_iterations=200, long_runs=2, recovery_kills=3, parked_runs=300,
                   approval_runs=300,
                   profile_iterations=60, waiting_parents=40, retention_runs=1_000, retention_load=50,
                   schedule_minutes=1.0, console_runs=10_000)

    @classmethod
    def tiny(cls) -> Sizes:
        return cls(overhead_iterations=3, floor_chains=3, peer_iterations=3, throughput_workers=(1,),
                   throughput_runs=2, throughput_iterations=2, floor_burst=10, throughput_turns=2, growth_iterations=4,
                   long_run_iterations=100, long_runs=2, growth_turn_chars=100, recovery_kills=1, parked_runs=5,
                   approval_runs=4,
                   profile_iterations=60, waiting_parents=4, retention_runs=40, retention_load=4,
                   schedule_minutes=0.1, schedule_every_s=2, console_runs=200)


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, suite: str, metric: str, value: Any, shown: str | None = None) -> None:
        self.figures.setdefault(suite, {})[metric] = value
        self.rows.append((suite, metric, shown if shown is not None else str(value)))

    def add_ms(self, suite: str, name: str, samples: list[float]) -> float:
        """Median and p99 of ``samples`` as two figures; returns the median."""
        med = statistics.median(samples)
        self.add(suite, f"{name}_median_ms", round(med, 2))
        self.add(suite, f"{name}_p99_ms", round(percentile(samples, 0.99), 2))
        return med

    def add_ratio(self, suite: str, name: str, ours: float, theirs: float) -> None:
        self.add(suite, name, round(ours / theirs, 2), f"{ours / theirs:.1f}×")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def tenths(samples: list[float]) -> tuple[list[float], list[float]]:
    """A run's samples in its first tenth and in its last (at least one each)."""
    tenth = max(1, len(samples) // 10)
    return samples[:tenth], samples[-tenth:]


def first_last_tenth_ms(samples: list[float]) -> list[float]:
    """The median of a run's first tenth and of its last (issue 23: a step late in a run costs what an early one
    does), rounded first, so that a ratio of the two is the one of the figures shown."""
    return [round(statistics.median(part), 2) for part in tenths(samples)]


@dataclass
class Fleet:
    env: dict[str, str]
    store: Store
    workers: WorkerProcesses

    @property
    def settings(self) -> agentfleet.Settings:
        return agentfleet.Settings(broker_url=self.env["AGENTFLEET_BROKER_URL"],
                                   database_url=self.env["AGENTFLEET_DATABASE_URL"],
                                   namespace=self.env["AGENTFLEET_NAMESPACE"], agents=self.env["AGENTFLEET_AGENTS"])

    @property
    def workspace(self) -> Path:
        return Path(self.env["AGENTFLEET_WORKSPACE"])

    def submit(self, agent: str, inputs: list[dict[str, Any]]) -> list[str]:
        """Publish one goal per input over one connection; the run ids, in order."""
        bodies = [{"agent": agent, "input": i, "goal_id": uuid.uuid4().hex} for i in inputs]
        with FleetClient(self.settings) as client:
            for body in bodies:
                client.publish_goal(body)
            return [client.run_id(b) for b in bodies]

    def run(self, agent: str, goal_input: dict[str, Any], timeout: float = 600,
            on_poll: Callable[[RunRecord | None], None] | None = None) -> str:
        (run_id,) = self.submit(agent, [goal_input])
        self.wait(run_id, timeout, on_poll)
        return run_id

    def wait(self, run_id: str, timeout: float = 600,
             on_poll: Callable[[RunRecord | None], None] | None = None) -> None:
        """Until the run has ended; ``on_poll`` is given its record at every poll (``wait_for_end``)."""
        if wait_for_end(self.store, run_id, timeout_s=timeout, on_poll=on_poll) is None:
            raise TimeoutError(f"run {run_id} did not finish; logs in {self.workers.logdir}")

    def count(self, sql: str, **params: Any) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.execute(text(sql), params).scalar_one())

    def pids(self, role: str | None = None) -> list[int]:
        """The live worker processes of ``role``, or of every role."""
        return [p.pid for name, p in self.workers.procs
                if (role is None or name.startswith(f"{role}.")) and p.poll() is None]


@contextmanager
def fleet(roles: dict[str, int], *worker_args: str, env: dict[str, str] | None = None,
          root: Path = ROOT) -> Iterator[Fleet]:
    """Worker processes (role → count, each started with ``worker_args``, and ``env`` over the fleet's settings) in
    a private namespace over a scratch database, running the code of the checkout at ``root`` (their working
    directory, which ``python -m`` puts first on their path)."""
    namespace = f"afbench-{uuid.uuid4().hex[:8]}"
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url, \
            tempfile.TemporaryDirectory() as tmp:
        env = {"AGENTFLEET_PROFILE": "distributed", "AGENTFLEET_BROKER_URL": BROKER, "AGENTFLEET_DATABASE_URL": url,
               "AGENTFLEET_REDIS_URL": REDIS, "AGENTFLEET_NAMESPACE": namespace,
               "AGENTFLEET_AGENTS": "benchmarks.agents", "AGENTFLEET_WORKSPACE": tmp,
               "AGENTFLEET_LOG_LEVEL": "WARNING", "PYTHONPATH": str(root),
               **{k: v.format(tmp=tmp) for k, v in (env or {}).items()}}
        workers = WorkerProcesses(env, Path(tmp) / "logs", cwd=root)
        engine = make_engine(url)
        try:
            for role, count in roles.items():
                for _ in range(count):
                    workers.start(role, *worker_args)
            workers.wait_ready(timeout=120)
            yield Fleet(env, Store(engine), workers)
        finally:
            workers.stop()
            engine.dispose()
            with Connection(BROKER) as conn:
                Topology(namespace).delete(conn)
            delete_redis_keys(namespace)


def clone_runs(f: Fleet, table: Table, seeds: list[str], copies: int, suffixed: tuple[str, ...],
               runs_columns: dict[str, str] | None = None) -> None:
    """``copies`` of the seed runs' rows in ``table``, with ``suffixed`` columns made unique per copy (``g``, the
    copy's number, is appended); in the runs table, ``runs_columns`` gives a column SQL of ``t`` (the seed's row)
    and ``g`` instead (made older, another state)."""
    names = [c.name for c in table.columns if c.name != "id"]
    exprs = []
    for name in names:
        if name in suffixed:
            exprs.append(f"t.{name} || '-c' || g")
        elif table.name == "runs" and name in (runs_columns or {}):
            exprs.append((runs_columns or {})[name])
        else:
            exprs.append(f"t.{name}")
    sql = (f"INSERT INTO {table.name} ({', '.join(names)}) SELECT {', '.join(exprs)} FROM {table.name} t, "
           f"generate_series(1, :copies) g WHERE t.run_id = ANY(:seeds)")
    with f.store.engine.begin() as conn:
        conn.execute(text(sql), {"copies": copies, "seeds": seeds})


def delete_redis_keys(namespace: str) -> None:
    """The namespace's health entries, breakers and cached results."""
    import redis

    from agentfleet.fleet.fleet_redis import forget_namespace

    try:
        client = redis.Redis.from_url(REDIS)
        forget_namespace(client, namespace)
        client.close()
    except redis.RedisError:
        pass  # Redis away: nothing of ours to clean


def wait_until(check: Callable[[], T], what: str, timeout: float, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:g}s waiting for {what}")
        time.sleep(interval)
    return got


def rss_bytes(pid: int) -> int:
    """Resident set size now, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def role_cpu_s(f: Fleet) -> dict[str, float]:
    """CPU seconds each role's worker processes have used so far (all of a role's processes together)."""
    return {role: sum(cpu_seconds(pid) for pid in f.pids(role)) for role in C.ROLES}


def cpu_ms_per_iteration(before: dict[str, float], after: dict[str, float], iterations: int) -> dict[str, float]:
    """Worker CPU per iteration, by role and in all: what a change costs even when latency hides it (a step that
    waits on I/O costs latency, one that computes costs this, and two cores of it cap throughput)."""
    per = {role: round((after[role] - before[role]) * 1000 / iterations, 2) for role in before}
    return {**per, "total": round(sum(per.values()), 2)}


def proc_stat(pid: int | str, tid: int | str | None = None) -> tuple[str, int]:
    """A process's (or one of its threads') name (comm) and the user + system clock ticks it has used so far, from
    /proc (Linux). A process's count includes its threads that have ended."""
    stat = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat").read_text()
    head, _, rest = stat.rpartition(") ")  # comm is in parentheses and may itself hold ") "
    fields = rest.split()
    return head.partition(" (")[2], int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used so far, from /proc (Linux)."""
    return proc_stat(pid)[1] / os.sysconf("SC_CLK_TCK")


def voluntary_switches(pid: int) -> int:
    """How often the process's live threads have given up the CPU to wait so far (/proc, Linux). On this project's
    VMs each such wait and its wake-up cost ~0.1 ms of CPU, so their count per iteration is the part of the CPU that
    goes with how the work is split between threads and round trips, counted rather than timed: it does not drift
    with the machine. A thread that ended (a tool call's) takes its count with it, once the kernel has let it go
    (a moment after ``join()`` returns): a lower bound."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread gone since the listing
            status = Path(task.path, "status").read_text()
            total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total


def switches_of(pids: Iterable[int]) -> int:
    """``voluntary_switches`` of these processes together."""
    return sum(voluntary_switches(pid) for pid in pids)


def role_switches(f: Fleet) -> dict[str, int]:
    """``voluntary_switches`` of each role's worker processes together."""
    return {role: switches_of(f.pids(role)) for role in C.ROLES}


# The services' processes, by the name the kernel gives them (/proc/PID/stat's comm).
SERVICES = {"rabbitmq": ("beam.smp", "erl_child_setup", "epmd", "inet_gethost"),
            "postgres": ("postgres",), "redis": ("redis-server",)}
CPU_GROUPS = ("workers", *SERVICES, "client", "rest")


def _process_ticks() -> dict[int, tuple[str, int]]:
    """Every live process: its comm and the clock ticks it has used."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone since the listing
                found[int(entry.name)] = proc_stat(entry.name)
    return found


def _busy_ticks() -> int:
    """Clock ticks the whole machine has spent not idle (/proc/stat: every process, those since exited, the
    kernel)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split(maxsplit=9)[1:9]]  # user … steal
    return sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent not idle so far (``_busy_ticks``)."""
    return _busy_ticks() / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class MachineCpu:
    """The whole machine's CPU over a stretch, split by who used it: the workers under test (the fleet's or a
    floor's), RabbitMQ, Postgres, Redis, this process (the client publishing and polling), and the rest (other
    processes, ones that exited, the kernel). Throughput on two cores is capped by the total, so the split shows
    where a gap to the floor lies (benchmarks/README.md, issue 23)."""

    workers: frozenset[int]
    before: dict[int, tuple[str, int]]
    busy_before: int

    @classmethod
    def of(cls, workers: Iterable[int]) -> MachineCpu:
        return cls(frozenset(workers), _process_ticks(), _busy_ticks())

    def ms_per(self, units: int) -> dict[str, float]:
        """CPU ms per unit (an iteration, a chain) since this was made, by group and in all."""
        after, busy = _process_ticks(), _busy_ticks()
        used = dict.fromkeys(CPU_GROUPS, 0)
        me = os.getpid()
        for pid, (comm, ticks) in after.items():
            earlier = self.before.get(pid)
            spent = ticks - earlier[1] if earlier is not None and earlier[0] == comm else ticks  # a pid reused: new
            group = ("workers" if pid in self.workers else "client" if pid == me
                     else next((name for name, comms in SERVICES.items() if comm in comms), None))
            if group is not None:
                used[group] += spent
        used["rest"] = max(0, busy - self.busy_before - sum(used.values()))
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        per = {group: round(ticks * tick_ms / units, 2) for group, ticks in used.items()}
        return {**per, "total": round((busy - self.busy_before) * tick_ms / units, 2)}


def machine() -> dict[str, Any]:
    import celery
    import kombu
    import sqlalchemy

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    engine = make_engine(PG_ADMIN)
    with engine.connect() as conn:
        postgres = conn.execute(text("SHOW server_version")).scalar_one()
    engine.dispose()
    with Connection(BROKER) as conn:
        conn.connect()
        rabbitmq = conn.connection.server_properties.get("version", b"?")
    return {"cores": os.cpu_count(), "memory_gib": round(mem, 1), "python": platform.python_version(),
            "agentfleet": agentfleet.__version__, "celery": celery.__version__, "kombu": kombu.__version__,
            "sqlalchemy": sqlalchemy.__version__, "postgres": postgres,
            "rabbitmq": rabbitmq.decode() if isinstance(rabbitmq, bytes) else str(rabbitmq),
            "date": datetime.now(UTC).date().isoformat()}
