"""Whose thread spends a hop's CPU: the fleet's workers against Celery + one commit a hop, thread by thread
(``python -m benchmarks.thread_cpu [ITERATIONS]``; figures in benchmarks/README.md, issue 23).

One ``bench_loop`` run, one iteration at a time, one worker per role; then as many three-hop chains of the floor
(``benchmarks/celery_floor.py``, committing), one at a time. Each worker's CPU is read from ``/proc`` before and
after, split into its consumer thread (the process's main thread: Celery's event loop, which receives, decodes,
hands each message to the pool and acks it), its pool threads (the handlings, or the floor's task bodies), and
threads that ended in between (the executor's tool-call threads; only the process's total still has them). Printed
in ms a message: each role or hop gets one message an iteration.

Unlike py-spy's ``--gil`` samples, which count a thread's time holding the interpreter lock whether or not the
machine runs it (on two busy cores a consumer holding the lock while preempted looks expensive), these are the
kernel's CPU times.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from agentfleet import constants as C
from agentfleet.store.db import scratch_database
from agentfleet.workers.roles import ROLES
from benchmarks.celery_floor import floor_workers
from benchmarks.common import ONE_EACH, PG_ADMIN, fleet, proc_stat

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Threads:
    """A process's CPU ticks: the whole process (ended threads included), its main thread, every live thread."""

    total: int
    main: int
    live: dict[str, int]

    @classmethod
    def of(cls, pid: int) -> Threads:
        live = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # ended while listed
                live[tid] = proc_stat(pid, tid)[1]
        return cls(proc_stat(pid)[1], live.get(str(pid), 0), live)

    def since(self, before: Threads, pid: int, messages: int) -> dict[str, float]:
        """ms a message: consumer (main thread), pool (other threads alive at the end), ended, total."""
        others = sum(t - before.live.get(tid, 0) for tid, t in self.live.items() if tid != str(pid))
        total, main = self.total - before.total, self.main - before.main
        per = TICK_MS / messages
        return {"consumer": round(main * per, 3), "pool": round(others * per, 3),
                "ended": round(max(0, total - main - others) * per, 3), "total": round(total * per, 3)}


def main(iterations: int = 600) -> None:
    rows: list[tuple[str, dict[str, float]]] = []
    with fleet(ONE_EACH) as f:
        f.run("bench_loop", {"iterations": 5})
        pids = {role: f.pids(role)[0] for role in ONE_EACH}
        before = {role: Threads.of(pid) for role, pid in pids.items()}
        f.run("bench_loop", {"iterations": iterations})
        rows += [(role, Threads.of(pid).since(before[role], pid, iterations)) for role, pid in pids.items()]
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url, \
            floor_workers(per_queue=1, concurrency=ROLES[C.PLANNER].default_concurrency, commit_url=url) as floor:
        floor.chain_ms(20)
        before_floor = [Threads.of(pid) for pid in floor.pids]
        floor.chain_ms(iterations)
        rows += [(f"floor hop {i}", Threads.of(pid).since(before_floor[i - 1], pid, iterations))
                 for i, pid in enumerate(floor.pids, 1)]
    print(f"{iterations} iterations (and chains), one at a time; CPU ms a message")
    print(f"{'':12} {'consumer':>9} {'pool':>9} {'ended':>9} {'total':>9}")
    for name, row in rows:
        print(f"{name:12} " + " ".join(f"{row[k]:9.3f}" for k in ("consumer", "pool", "ended", "total")))
    for label, names in (("fleet", list(ONE_EACH)), ("floor", [n for n, _ in rows if n.startswith("floor")])):
        part = [row for n, row in rows if n in names]
        print(f"{label + ' sum':12} " + " ".join(f"{sum(r[k] for r in part):9.3f}"
                                                 for k in ("consumer", "pool", "ended", "total")))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
