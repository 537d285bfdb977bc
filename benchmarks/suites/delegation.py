"""Parents waiting on slow children: what the workers hold for a parent that waits (issue 10: nothing).

Each ``bench_parent`` hands its one call to a ``bench_loop`` child that holds in its tool. The
parents sit in WAITING_CHILDREN with no worker slot; the children hold the executor's threads, the
rest of their calls wait in RabbitMQ. Worker memory is read before, after half the parents wait and
after all do, as the in-flight suite does for parked runs.
"""

from __future__ import annotations

import time

from agentfleet.loop.states import RunState
from benchmarks.agents import RELEASE_FILE
from benchmarks.common import ONE_EACH, Report, Sizes, fleet, wait_until
from benchmarks.suites.in_flight import add_parked_figures, database_bytes, worker_rss

SUITE = "delegation"


def run(sizes: Sizes, report: Report) -> None:
    parents = sizes.waiting_parents
    halves = (parents // 2, parents - parents // 2)
    waiting = f"SELECT count(*) FROM runs WHERE agent = 'bench_parent' AND state = '{RunState.WAITING_CHILDREN.value}'"
    with fleet(ONE_EACH) as f:
        for _ in range(2):  # warm-up: a parent and its child end to end, before the baseline
            f.run("bench_loop", {"iterations": 3})
        rss, db = [worker_rss(f)], [database_bytes(f)]
        wait_s = 0.0
        for n, target in zip(halves, (halves[0], parents), strict=True):
            t0 = time.monotonic()
            f.submit("bench_parent", [{}] * n)
            wait_until(lambda t=target: f.count(waiting) == t, f"{target} parents to wait on their children",
                       timeout=120 + n * 0.2, interval=1)
            wait_s += time.monotonic() - t0
            time.sleep(2)  # let the last handlers return before reading memory
            rss.append(worker_rss(f))
            db.append(database_bytes(f))
        (f.workspace / RELEASE_FILE).touch()  # the children finish; their parents end
        ended = "SELECT count(*) FROM runs WHERE agent = 'bench_parent' AND state = 'SUCCEEDED'"
        t0 = time.monotonic()
        wait_until(lambda: f.count(ended) == parents, f"{parents} parents to end", timeout=300 + parents, interval=1)
        drain_s = time.monotonic() - t0
    report.add(SUITE, "waiting_parents", parents)
    report.add(SUITE, "seconds_to_wait", round(wait_s, 1), f"{wait_s:.1f} s")
    report.add(SUITE, "seconds_to_end_after_release", round(drain_s, 1), f"{drain_s:.1f} s")
    add_parked_figures(report, SUITE, rss, db, halves)
