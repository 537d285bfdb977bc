"""Retention under load: prune 10,000 ended runs while 200 runs go, against the same 200 runs without it.

The ended runs are copies of real ones (20 bench_loop runs of 3 iterations, with their steps, transcript,
observations, audit rows and dedupe marks), made 40 days old. The load is 200 bench_loop runs of 5 iterations,
submitted at once, three times: alone, beside a prune of everything older than 30 days, alone again (the noise).
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import timedelta

from sqlalchemy import text

from agentfleet.roles.retention import PruneReport, cutoffs, prune
from agentfleet.store import tables as T
from agentfleet.store.records import now
from benchmarks.common import ONE_EACH, Fleet, Report, Sizes, clone_runs, fleet
from benchmarks.suites.overhead import iteration_times_ms

SUITE = "retention"
SEEDS = 20
LOAD_ITERATIONS = 5


def _load(f: Fleet, runs: int) -> tuple[list[float], int]:
    """``runs`` bench_loop runs at once: every plan-to-plan interval, and how many did not succeed."""
    ids = f.submit("bench_loop", [{"iterations": LOAD_ITERATIONS}] * runs)
    for run_id in ids:
        f.wait(run_id, timeout=600)
    times: list[float] = []
    bad = 0
    for run_id in ids:
        run = f.store.get_run(run_id)
        bad += int(run is None or not run.result or run.result.get("status") != "succeeded")
        times += iteration_times_ms(f.store, run_id)
    return times, bad


def run(sizes: Sizes, report: Report) -> None:
    old_runs, load_runs = sizes.retention_runs, sizes.retention_load
    with fleet(ONE_EACH) as f:
        seeds = f.submit("bench_loop", [{"iterations": 3}] * SEEDS)
        for run_id in seeds:
            f.wait(run_id)
        copies = old_runs // SEEDS
        for table, suffixed in ((T.runs, ("run_id", "goal_id")), (T.steps, ("run_id", "idempotency_key")),
                                (T.messages, ("run_id",)), (T.observations, ("run_id",)), (T.audit, ("run_id",)),
                                (T.processed_events, ("run_id", "event_id"))):
            clone_runs(f, table, seeds, copies, suffixed, {c: f"t.{c} - interval '40 days'"
                                                           for c in ("updated_at", "created_at")})
        with f.store.engine.connect() as conn:
            conn.execute(text("ANALYZE"))
        _load(f, min(20, load_runs))  # warm-up
        alone, alone_bad = _load(f, load_runs)
        done: list[PruneReport] = []
        pruner = threading.Thread(target=lambda: done.append(prune(f.store, cutoffs(30, {}, now()),
                                                                   history_before=now() - timedelta(days=30))))
        t0 = time.monotonic()
        pruner.start()
        beside, beside_bad = _load(f, load_runs)
        load_s = time.monotonic() - t0
        pruner.join()
        again, again_bad = _load(f, load_runs)
    pruned = done[0]
    med = {k: statistics.median(v) for k, v in (("alone", alone), ("beside", beside), ("again", again))}
    report.add(SUITE, "ended_runs_pruned", pruned.runs, f"{pruned.runs} of {copies * SEEDS} in {pruned.seconds:.1f} s "
               f"(it rests 4× what each batch took; the load beside it ran its first {load_s:.1f} s)")
    report.add(SUITE, "rows_deleted", sum(n for t, n in pruned.rows.items() if t != "runs"),
               ", ".join(f"{t} {n}" for t, n in sorted(pruned.rows.items()) if n))
    report.add(SUITE, "database_mib_before_after", [round((pruned.bytes_before or 0) / 2**20, 1),
                                                    round((pruned.bytes_after or 0) / 2**20, 1)])
    report.add(SUITE, "rows_freed_mib", round((pruned.freed_bytes or 0) / 2**20, 1))
    report.add(SUITE, "load_failed_alone_beside_again", [alone_bad, beside_bad, again_bad])
    report.add(SUITE, "load_iteration_median_ms_alone_beside_again",
               [round(med["alone"], 2), round(med["beside"], 2), round(med["again"], 2)],
               f"{med['alone']:.2f} / {med['beside']:.2f} / {med['again']:.2f} ms (alone / beside the prune / "
               f"alone again: the last two differ by the noise)")

