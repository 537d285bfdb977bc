"""Checkpoint growth: bytes stored per iteration as a long run with fat model turns grows; and whether an iteration
takes longer late in a long plain run than early in it (issue 23: first 10% against last 10%, within 10%)."""

from __future__ import annotations

import statistics

from sqlalchemy import text

from agentfleet.store import Store
from benchmarks.common import ONE_EACH, Report, Sizes, first_last_tenth_ms, fleet
from benchmarks.suites.overhead import iteration_times_ms

SUITE = "growth"


def run(sizes: Sizes, report: Report) -> None:
    with fleet(ONE_EACH) as f:
        run_id = f.run("bench_loop", {"iterations": sizes.growth_iterations, "turn_chars": sizes.growth_turn_chars})
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
        long_id = f.run("bench_loop", {"iterations": sizes.long_run_iterations + 1})
        times = iteration_times_ms(f.store, long_id)
        # The same past a 4,096-token window (compacted from about the twelfth turn on): bench_loop's turns pass 128k
        # only at ~1,250 iterations, and a plan's assembly once grew with every turn past it (benchmarks/README.md).
        windowed_id = f.run("bench_window", {"iterations": sizes.long_run_iterations + 1, "turn_chars": 200})
        windowed = iteration_times_ms(f.store, windowed_id)
        folded = _turns_folded_last(f.store, windowed_id)
    ordered = [per_iter[i] for i in sorted(per_iter)][:-1]  # the last iteration is the final answer
    tenth = max(1, len(ordered) // 10)
    first, last = statistics.mean(ordered[:tenth]), statistics.mean(ordered[-tenth:])
    stored = sum(per_iter.values()) + processed_bytes
    report.add(SUITE, "iterations", sizes.growth_iterations)
    report.add(SUITE, "bytes_per_iteration_first_10pct", round(first))
    report.add(SUITE, "bytes_per_iteration_last_10pct", round(last))
    report.add(SUITE, "last_over_first", round(last / first, 3), f"{last / first:.2f} (flat = 1.00)")
    report.add(SUITE, "stored_bytes_total", stored)
    report.add(SUITE, "transcript_bytes", transcript)
    report.add(SUITE, "stored_over_transcript", round(stored / transcript, 2), f"{stored / transcript:.2f}×")
    report.add(SUITE, "long_run_iterations", sizes.long_run_iterations)
    for name, samples in (("long_run", times), ("past_window", windowed)):
        early, late = first_last_tenth_ms(samples)
        report.add(SUITE, f"{name}_first_last_10pct_median_ms", [early, late])
        report.add(SUITE, f"{name}_last_over_first", round(late / early, 3), f"{late / early:.2f} (flat = 1.00)")
    report.add(SUITE, "past_window_turns_folded_at_the_end", folded)


def _turns_folded_last(store: Store, run_id: str) -> int:
    """How many older turns the run's last plan folded into the summary (its plan step's context report)."""
    plans = [s for s in store.steps(run_id) if s["kind"] == "plan"]
    output = plans[-1]["output"] if plans else None
    return int((((output or {}).get("context") or {}).get("compacted") or {}).get("turns", 0))
