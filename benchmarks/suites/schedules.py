"""Schedules with two schedulers: a 10 s schedule for ten minutes (the issue's check; 2 s for 6 s at the tests'
tiny size), two observer workers firing it, one SIGKILLed half-way. Counted: ticks due, runs started, ticks with no
run, ticks with more than one (a run per goal id makes that impossible, which is what is counted)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from agentfleet import constants as C
from agentfleet.ops.schedules import add_schedule
from benchmarks.common import Fleet, Report, Sizes, fleet

SUITE = "schedules"


def _ticks(f: Fleet) -> list[datetime]:
    prefix = "schedule:soak:"
    got = [r.goal_id[len(prefix):] for r in f.store.list_runs(agent="bench_loop", limit=100_000)
           if r.goal_id.startswith(prefix)]
    return sorted(datetime.fromisoformat(t.replace("Z", "+00:00")) for t in got)


def run(sizes: Sizes, report: Report) -> None:
    seconds, every = sizes.schedule_minutes * 60, sizes.schedule_every_s
    with fleet({C.PLANNER: 1, C.EXECUTOR: 1, C.OBSERVER: 2}) as f:
        added = add_schedule(f.store, "soak", "bench_loop", {"iterations": 1}, every_s=every, catch_up="all")
        first_due = added["next_at"]
        t0 = time.monotonic()
        killed = False
        while time.monotonic() - t0 < seconds:
            time.sleep(1)
            if not killed and time.monotonic() - t0 >= seconds / 2:
                observer = next(name for name, p in f.workers.procs if name.startswith(f"{C.OBSERVER}."))
                killed = f.workers.kill(observer)  # SIGKILL: whatever it held, it holds no more
        last_due = first_due + timedelta(seconds=every * int((datetime.now(first_due.tzinfo) - first_due)
                                                               .total_seconds() // every))
        time.sleep(min(3, every))  # the last tick's run starts
        ticks = _ticks(f)
    due = [first_due + timedelta(seconds=every * k) for k in range(int((last_due - first_due).total_seconds()
                                                                       // every) + 1)]
    fired = set(ticks)
    report.add(SUITE, "schedule", f"every {every}s for {sizes.schedule_minutes:g} min, 2 schedulers, one "
                                  f"SIGKILLed at half-time")
    report.add(SUITE, "ticks_due", len(due))
    report.add(SUITE, "runs_started", len(ticks))
    report.add(SUITE, "ticks_lost", len([t for t in due if t not in fired]))
    report.add(SUITE, "ticks_doubled", len(ticks) - len(fired))
