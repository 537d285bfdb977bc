"""The numbers the activity charts plot, and the charts themselves: pure functions of what the store read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from agentfleet.console import charts
from agentfleet.ops.activity import latency, percentile, runs_over_time

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50.0, 90.0, 99.0)
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


def test_an_iteration_is_turn_start_to_next_turn_start_within_one_run() -> None:
    steps = [{"run_id": "a", "iteration": i, "kind": "plan", "started_at": T0 + timedelta(milliseconds=40 * i),
              "duration_ms": 1.0} for i in range(4)]
    steps += [{"run_id": "b", "iteration": 0, "kind": "plan", "started_at": T0, "duration_ms": 2.0},
              {"run_id": "b", "iteration": 2, "kind": "plan", "started_at": T0 + timedelta(seconds=9),  # 1 is gone
               "duration_ms": 2.0},
              {"run_id": "a", "iteration": 0, "kind": "tool", "started_at": T0, "duration_ms": 5.0}]
    found = latency(steps)
    assert found["iteration"] == {"count": 3, "p50": 40.0, "p90": 40.0, "p99": 40.0}
    assert found["plan"]["count"] == 6 and found["tool"] == {"count": 1, "p50": 5.0, "p90": 5.0, "p99": 5.0}


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["SUCCEEDED", "FAILED"]),
                          st.floats(0, 5, allow_nan=False)), min_size=1, max_size=200))
def test_every_run_falls_in_exactly_one_bucket(rows: list[tuple[int, str, float]]) -> None:
    runs = sorted(({"created_at": T0 + timedelta(seconds=s), "state": state, "cost_usd": cost, "tokens": 3}
                   for s, state, cost in rows), key=lambda r: r["created_at"], reverse=True)
    found = runs_over_time(runs, buckets=24)
    assert sum(b["runs"] for b in found["buckets"]) == len(runs)
    assert sum(b["failed"] for b in found["buckets"]) == sum(r["state"] == "FAILED" for r in runs)
    assert abs(sum(b["cost_usd"] for b in found["buckets"]) - sum(r["cost_usd"] for r in runs)) < 1e-6


def test_a_chart_escapes_its_labels_and_says_zero_when_all_is_zero() -> None:
    drawn = str(charts.bars("<script>x</script>", ["<b>"], [0.0]))
    assert "<script>" not in drawn and "&lt;script&gt;" in drawn and "<b>" not in drawn
    assert "max 0" in drawn
    assert str(charts.lines("depth", [], {"planner": []})).startswith("<svg")
