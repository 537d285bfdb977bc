"""Checkpoint growth: bytes stored per iteration as a long run with fat model turns grows; and whether an iteration
takes longer late in a long plain run than early in it (issue 23: first 10% against last 10%, within 10%).

An iteration's wall time on this shared VM swings by a third from one second to the next (a tenth of a 1,000-iteration
run is under a second), so one run's first and last tenth differed by 0.71-1.47x with nothing growing (the tenths in
between went up and down). The check therefore takes several long runs (their tenths pooled, each run's ratio shown)
and, beside the wall time, the workers' CPU an iteration over the same two tenths: a cost that grows with the run
shows in both, a busy neighbour only in the wall time. The runs past a small context window are taken the same way:
a single one read 0.83 to 1.19 from one run to the next."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from agentfleet.store import Store
from agentfleet.store.records import RunRecord
from benchmarks.common import ONE_EACH, Fleet, Report, Sizes, busy_cpu_s, first_last_tenth_ms, fleet, role_cpu_s, tenths
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
        long_runs = [_long_run(f, "bench_loop", sizes.long_run_iterations) for _ in range(sizes.long_runs)]
        # The same past a 4,096-token window (compacted from about the twelfth turn on): bench_loop's turns pass 128k
        # only at ~1,250 iterations, and a plan's assembly once grew with every turn past it (benchmarks/README.md).
        windowed = [_long_run(f, "bench_window", sizes.long_run_iterations, turn_chars=200)
                    for _ in range(sizes.long_runs)]
        folded = _turns_folded_last(f.store, windowed[-1].run_id)
    ordered = [per_iter[i] for i in sorted(per_iter)][:-1]  # the last iteration is the final answer
    first, last = (statistics.mean(part) for part in tenths(ordered))
    stored = sum(per_iter.values()) + processed_bytes
    report.add(SUITE, "iterations", sizes.growth_iterations)
    report.add(SUITE, "bytes_per_iteration_first_10pct", round(first))
    report.add(SUITE, "bytes_per_iteration_last_10pct", round(last))
    report.add(SUITE, "last_over_first", round(last / first, 3), f"{last / first:.2f} (flat = 1.00)")
    report.add(SUITE, "stored_bytes_total", stored)
    report.add(SUITE, "transcript_bytes", transcript)
    report.add(SUITE, "stored_over_transcript", round(stored / transcript, 2), f"{stored / transcript:.2f}×")
    report.add(SUITE, "long_run_iterations", sizes.long_run_iterations)
    report.add(SUITE, "long_runs", len(long_runs))
    _first_and_last_tenths(report, "long_run", long_runs)
    report.add(SUITE, "past_window_runs", len(windowed))
    _first_and_last_tenths(report, "past_window", windowed)
    report.add(SUITE, "past_window_turns_folded_at_the_end", folded)


def _first_and_last_tenths(report: Report, kind: str, runs: list[LongRun]) -> None:
    """The runs' first tenth against their last: plan to plan (the tenths pooled, each run's ratio shown), and the
    workers' and the machine's CPU an iteration over the same tenths (summed over the runs)."""
    each = [round(late / early, 2) for early, late in (first_last_tenth_ms(r.times) for r in runs)]
    split = [tenths(r.times) for r in runs]
    early, late = (round(statistics.median([t for parts in split for t in parts[k]]), 2) for k in (0, 1))
    report.add(SUITE, f"{kind}_first_last_10pct_median_ms", [early, late])
    report.add(SUITE, f"{kind}_last_over_first", round(late / early, 3),
               f"{late / early:.2f} (flat = 1.00; the runs' tenths pooled; each run's: {', '.join(map(str, each))})")
    report.add(SUITE, f"{kind}_last_over_first_each", each)
    for who, k, shown in (("worker", 0, "the workers' CPU an iteration, /proc"),
                          ("machine", 1, "the whole machine's: Postgres and RabbitMQ too, and this client's polls")):
        first = round(sum(r.first[k] for r in runs) * 1000 / sum(r.first[2] for r in runs), 2)
        last = round(sum(r.last[k] for r in runs) * 1000 / sum(r.last[2] for r in runs), 2)
        report.add(SUITE, f"{kind}_{who}_cpu_first_last_10pct_ms", [first, last])
        report.add(SUITE, f"{kind}_{who}_cpu_last_over_first", round(last / first, 3),
                   f"{last / first:.2f} (flat = 1.00; {shown})")


CpuWindow = tuple[float, float, int]  # the workers' and the machine's CPU seconds over a window of a run, and the
# iterations it spans
Poll = tuple[int, float, float]  # a run's iteration, the workers' CPU and the machine's, read together


@dataclass(frozen=True)
class LongRun:
    run_id: str
    times: list[float]  # plan to plan, ms
    first: CpuWindow  # over its first tenth
    last: CpuWindow  # over its last tenth


def _long_run(f: Fleet, agent: str, iterations: int, **goal: Any) -> LongRun:
    """One run of ``agent`` (a ``bench_loop`` model) for ``iterations`` (and its final answer): its plan-to-plan
    times, and the workers' and the machine's CPU over its first tenth and over its last. The run's iteration and the
    CPU are read together at every poll of its record (every 50 ms, some seven iterations); a window runs from one
    poll to the first poll a tenth or more away."""
    polls: list[Poll] = []

    def poll(run: RunRecord | None) -> None:
        if run is not None and run.result is None:  # live, or ended with its Result still to come: not its end
            polls.append((run.iteration, sum(role_cpu_s(f).values()), busy_cpu_s()))

    run_id = f.run(agent, {"iterations": iterations + 1, **goal}, on_poll=poll)
    tenth = max(1, iterations // 10)
    live = [p for p in polls if 1 <= p[0] <= iterations]  # not its start, nor its final answer
    if len({p[0] for p in live}) < 2:
        raise RuntimeError(f"run {run_id} went by between two polls: too short to see its tenths")
    return LongRun(run_id, iteration_times_ms(f.store, run_id), _window(live, live[0], tenth),
                   _window(live, live[-1], -tenth))


def _window(polls: list[Poll], edge: Poll, span: int) -> CpuWindow:
    """The CPU between the poll ``edge`` and the first poll ``span`` iterations or more from it (after it when
    ``span`` is positive, before it when negative; the farthest poll when none is that far)."""
    def away(p: Poll) -> int:  # iterations from the edge, in the window's direction
        return (p[0] - edge[0]) if span > 0 else (edge[0] - p[0])

    far = [p for p in polls if away(p) >= abs(span)]
    other = min(far, key=away) if far else max(polls, key=away)
    (a_i, a_workers, a_machine), (b_i, b_workers, b_machine) = sorted([edge, other])
    return b_workers - a_workers, b_machine - a_machine, b_i - a_i


def _turns_folded_last(store: Store, run_id: str) -> int:
    """How many older turns the run's last plan folded into the summary (its plan step's context report)."""
    plans = [s for s in store.steps(run_id) if s["kind"] == "plan"]
    output = plans[-1]["output"] if plans else None
    return int((((output or {}).get("context") or {}).get("compacted") or {}).get("turns", 0))
