"""What a second worker process per role costs, alternated so the machine's drift cannot pass for it
(``python -m benchmarks.process_scaling [ROUNDS] [RUNS] [ITERATIONS]``; figures in benchmarks/README.md, issue 23).

Issue 23 asks that throughput not fall with 2 processes per role. ``bench throughput`` takes each count once, minutes
apart, and on this VM one invocation read 2 per role as 0.77× of 1 where a hand-run pair an hour later read 1.15×.
Here 1 and 2 per role run in turns, ``ROUNDS`` times, each a fresh fleet over ``RUNS`` goals of ``ITERATIONS``
(``iterations_per_s``, the throughput suite's own) and then Celery + one commit a hop with as many processes a queue
(``floor_workers``); each with the whole machine's CPU an iteration (``MachineCpu``) split by whose it is. And, for
the fleet, what Postgres did an iteration: transactions committed, rows inserted, updated and read, buffers hit
(``pg_stat_database``). On 2026-12-06 these gave the cause away: see benchmarks/README.md.

While the fleet runs, Postgres's sessions of its database are sampled every 5 ms: what each active one was waiting
on (``pg_stat_activity``; ``cpu`` when nothing), from the admin database. The sampler is one more client on two
cores: its own CPU shows as ``client`` and Postgres, and it slows every figure a little, the same for 1 and 2 per
role.
"""

from __future__ import annotations

import collections
import statistics
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, text

from agentfleet.store.db import make_engine
from agentfleet.workers.roles import ROLES
from benchmarks.common import PG_ADMIN, Fleet, MachineCpu, fleet, wait_until
from benchmarks.suites.throughput import committed_floor, iterations_per_s

# What the database did, per iteration: its transactions, rows written and rows read (``pg_stat_database``). Postgres 15
# keeps a session's counts in the session for up to a second (ten when it is idle) and always hands them over when
# it ends: they are read once the workers have stopped and their sessions are gone. The fleet's own polling for the
# runs' end (``iterations_per_s``, every 0.2 s) is counted too, the same way for 1 and 2 per role, and so may be what
# the warm-up's sessions still held when the first reading was taken (three iterations of the run's hundreds).
COUNTERS = ("xact_commit", "tup_inserted", "tup_updated", "tup_fetched", "blks_hit")
# Read from the admin database, so that neither the sampler nor the reads of these counters add to them.
WAITS = ("SELECT coalesce(wait_event_type, 'cpu') || ' ' || coalesce(wait_event, '') FROM pg_stat_activity "
         "WHERE datname = :db AND state = 'active'")
COUNTS = f"SELECT {', '.join(COUNTERS)} FROM pg_stat_database WHERE datname = :db"
SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = :db"


@contextmanager
def sampled_waits(db: str, every_s: float = 0.005) -> Iterator[collections.Counter[str]]:
    """Counts of what the active sessions of database ``db`` wait on, sampled until the block ends."""
    counts: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def sample() -> None:
        with _admin() as conn:
            while not done.wait(every_s):
                counts.update(conn.execute(text(WAITS), {"db": db}).scalars())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield counts
    finally:
        done.set()
        sampler.join()


@contextmanager
def _admin() -> Iterator[Connection]:
    engine = make_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def counters(db: str) -> dict[str, int]:
    """``db``'s counters now: call it once the sessions whose work is counted have ended (``ended_sessions``)."""
    with _admin() as conn:
        return dict(zip(COUNTERS, map(int, conn.execute(text(COUNTS), {"db": db}).one()), strict=True))


def ended_sessions(f: Fleet, db: str) -> None:
    """Stop the fleet's workers and close its own connections, and wait until their sessions are gone (a session
    hands its counts over as it ends)."""
    f.workers.stop()
    f.store.engine.dispose()
    with _admin() as conn:
        wait_until(lambda: conn.execute(text(SESSIONS), {"db": db}).scalar_one() == 0, "the fleet's sessions to end",
                   timeout=30, interval=0.05)


def main(rounds: int = 3, runs: int = 60, iterations: int = 20) -> None:
    rates: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, int], list[dict[str, float]]] = collections.defaultdict(list)
    waits: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    database: dict[int, list[dict[str, float]]] = collections.defaultdict(list)
    for n in [1, 2] * rounds:
        with fleet(dict.fromkeys(ROLES, n)) as f:
            f.run("bench_loop", {"iterations": 3})  # warm-up
            db = f.env["AGENTFLEET_DATABASE_URL"].rsplit("/", 1)[1]
            machine, before = MachineCpu.of(f.pids()), counters(db)
            with sampled_waits(db) as counts:
                rates["agentfleet", n].append(iterations_per_s(f, runs, iterations))
            cpu["agentfleet", n].append(machine.ms_per(runs * iterations))
            waits[n].update(counts)
            ended_sessions(f, db)
            after = counters(db)
            database[n].append({k: round((after[k] - before[k]) / (runs * iterations), 2) for k in COUNTERS})
        rate, floor_cpu = committed_floor(n, runs * iterations)
        rates["celery_commit", n].append(rate)
        cpu["celery_commit", n].append(floor_cpu)
        print(f"{n} per role: agentfleet {rates['agentfleet', n][-1]:.1f} it/s {cpu['agentfleet', n][-1]}; "
              f"Celery + commit {rates['celery_commit', n][-1]:.1f} chains/s {cpu['celery_commit', n][-1]}", flush=True)
    print(f"\n{rounds} rounds, medians; CPU ms an iteration (a chain for Celery + commit)")
    for side in ("agentfleet", "celery_commit"):
        for n in (1, 2):
            split = {g: round(statistics.median(c[g] for c in cpu[side, n]), 2) for g in cpu[side, n][0]}
            print(f"{side:14} {n} per role: {statistics.median(rates[side, n]):7.1f}/s  {split}")
        print(f"{side:14} 2 over 1: {statistics.median(rates[side, 2]) / statistics.median(rates[side, 1]):.2f}×")
    for n in (1, 2):
        print(f"Postgres an iteration, {n} per role: "
              + ", ".join(f"{k} {statistics.median(d[k] for d in database[n]):.2f}" for k in COUNTERS))
    for n in (1, 2):
        total = sum(waits[n].values()) or 1
        print(f"Postgres waits, {n} per role: "
              + ", ".join(f"{what} {count / total:.0%}" for what, count in waits[n].most_common(5)))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
