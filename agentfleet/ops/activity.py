"""The fleet's recent activity as numbers a chart plots: runs and cost over time, step latency percentiles.

Read from the newest runs and steps only (an index read backwards, ``RECENT_RUNS`` and ``RECENT_STEPS`` rows at
most), so the cost of a look is fixed however large the database grows; the window a chart spans is what those
rows cover, and it says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from agentfleet.store.repository import Store

RECENT_RUNS = 2000
RECENT_STEPS = 4000
BUCKETS = 24
_ENDED_BADLY = {"FAILED", "CANCELLED"}


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile of values already sorted (None for none)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def runs_over_time(runs: list[dict[str, Any]], buckets: int = BUCKETS) -> dict[str, Any]:
    """The runs (newest first, as ``Store.recent_runs`` gives them) counted and costed in ``buckets`` equal spans
    from the oldest to the newest."""
    if not runs:
        return {"start": None, "end": None, "span_s": 0.0, "buckets": []}
    start, end = runs[-1]["created_at"], runs[0]["created_at"]
    span = max((end - start).total_seconds(), 1.0)
    width = span / buckets
    rows = [{"at": start + timedelta(seconds=i * width), "runs": 0, "failed": 0, "cost_usd": 0.0, "tokens": 0}
            for i in range(buckets)]
    for r in runs:
        i = min(int((r["created_at"] - start).total_seconds() / width), buckets - 1)
        rows[i]["runs"] += 1
        rows[i]["failed"] += r["state"] in _ENDED_BADLY
        rows[i]["cost_usd"] += r["cost_usd"]
        rows[i]["tokens"] += r["tokens"]
    return {"start": start, "end": end, "span_s": span, "buckets": rows}


def latency(steps: list[dict[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """p50, p90 and p99 in ms, with how many were read, of model turns (``plan``), tool calls (``tool``) and whole
    iterations (``iteration``: from one model turn's start to the next one's in the same run: the turn, its calls,
    the observation and every hop between)."""
    found: dict[str, dict[str, float | int | None]] = {}
    for kind in ("plan", "tool"):
        found[kind] = _percentiles(sorted(s["duration_ms"] for s in steps if s["kind"] == kind))
    starts: dict[str, dict[int, datetime]] = {}
    for s in steps:
        if s["kind"] == "plan":
            starts.setdefault(s["run_id"], {})[s["iteration"]] = s["started_at"]
    gaps = [(turns[i + 1] - turns[i]).total_seconds() * 1000 for turns in starts.values() for i in turns
            if i + 1 in turns]
    found["iteration"] = _percentiles(sorted(gaps))
    return found


def _percentiles(values: list[float]) -> dict[str, float | int | None]:
    return {"count": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99)}


def activity(store: Store, *, runs: int = RECENT_RUNS, steps: int = RECENT_STEPS) -> dict[str, Any]:
    recent = store.recent_runs(runs)
    return {"runs": runs_over_time(recent), "runs_read": len(recent), "latency": latency(store.recent_steps(steps))}


def time_format(span_s: float) -> str:
    """How a chart labels its buckets: seconds for a short window, dates for a long one."""
    if span_s < 3600:
        return "%H:%M:%S"
    return "%H:%M" if span_s < 86400 else "%m-%d %H:%M"


def window_label(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "no runs yet"
    return f"{start.isoformat(timespec='minutes')} to {end.isoformat(timespec='minutes')}"
