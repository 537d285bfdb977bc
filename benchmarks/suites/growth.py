"""Checkpoint growth: bytes stored per iteration as a long run with fat model turns grows."""

from __future__ import annotations

import statistics

from sqlalchemy import text

from benchmarks.common import ONE_EACH, Report, Sizes, fleet

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
