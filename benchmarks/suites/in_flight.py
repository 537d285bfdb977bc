"""Many runs parked waiting on a slow tool: what the workers and the database hold for them.

The executor's threads are all inside ``hold`` (a tool that waits for a file); every other run
has its ``tool.requested`` waiting in RabbitMQ and its checkpoint in Postgres. A worker should
hold nothing per waiting run: its memory after parking the runs is compared with before.
"""

from __future__ import annotations

import time

from kombu import Connection

from agentfleet import constants as C
from agentfleet.loop.states import RunState
from agentfleet.workers.roles import ROLES
from benchmarks.agents import RELEASE_FILE
from benchmarks.common import BROKER, ONE_EACH, Fleet, Report, Sizes, fleet, rss_bytes, wait_until

SUITE = "in_flight"
MIB = 2**20


def worker_rss(f: Fleet) -> dict[str, int]:
    return {role: sum(rss_bytes(pid) for pid in f.pids(role)) for role in ONE_EACH}


def database_bytes(f: Fleet) -> int:
    return f.count("SELECT pg_database_size(current_database())")


def queue_depth(f: Fleet, role: str) -> int:
    with Connection(BROKER) as conn:
        _, messages, _ = conn.default_channel.queue_declare(queue=ROLES[role].queue(f.settings.namespace),
                                                            passive=True)
        return int(messages)


def run(sizes: Sizes, report: Report) -> None:
    """Park the runs in two halves: memory held per run would grow again in the second half."""
    parked, halves = sizes.parked_runs, (sizes.parked_runs // 2, sizes.parked_runs - sizes.parked_runs // 2)
    waiting = f"SELECT count(*) FROM runs WHERE state = '{RunState.EXECUTING.value}'"
    with fleet(ONE_EACH) as f:
        for _ in range(3):  # warm-up: every code path a parked run takes, before the baseline
            f.run("bench_loop", {"iterations": 3})
        rss, db = [worker_rss(f)], [database_bytes(f)]
        park_s = 0.0
        for n, target in zip(halves, (halves[0], parked), strict=True):
            t0 = time.monotonic()
            f.submit("bench_loop", [{"iterations": 2, "hold": True}] * n)
            wait_until(lambda t=target: f.count(waiting) == t, f"{target} runs to park",
                       timeout=120 + n * 0.1, interval=1)
            park_s += time.monotonic() - t0
            time.sleep(2)  # let the last handlers return before reading memory
            rss.append(worker_rss(f))
            db.append(database_bytes(f))
        in_queue = queue_depth(f, C.EXECUTOR)
        (f.workspace / RELEASE_FILE).touch()  # lets the held tool calls return, so the workers stop warm

    report.add(SUITE, "parked_runs", parked)
    report.add(SUITE, "seconds_to_park", round(park_s, 1), f"{park_s:.1f} s ({parked / park_s:.0f} runs/s)")
    report.add(SUITE, "tool_requests_waiting_in_rabbitmq", in_queue)
    add_parked_figures(report, SUITE, rss, db, halves)


def add_parked_figures(report: Report, suite: str, rss: list[dict[str, int]], db: list[int],
                       halves: tuple[int, int]) -> None:
    """Worker memory and database size before, after the first half and after all were parked."""
    for role in ONE_EACH:
        mib = [round(r[role] / MIB, 1) for r in rss]
        second = (rss[2][role] - rss[1][role]) / max(1, halves[1])
        report.add(suite, f"{role}_rss_mib_before_half_all", mib,
                   f"{' → '.join(f'{m:.1f}' for m in mib)} MiB ({second:+,.0f} B per run parked in the second half)")
    per_run = (db[2] - db[0]) / sum(halves)
    report.add(suite, "database_mib_before_half_all", [round(d / MIB, 1) for d in db],
               f"{' → '.join(f'{d / MIB:.1f}' for d in db)} MiB ({per_run:,.0f} B per parked run)")
    report.add(suite, "database_bytes_per_parked_run", round(per_run))
