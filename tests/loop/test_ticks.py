"""When a schedule's goals are due: intervals, cron in a time zone, jitter, catch-up after downtime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfleet.errors import ConfigurationError
from agentfleet.loop.ticks import MAX_CATCH_UP, Spec, due, goal_id_for, jitter, next_after

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_an_interval_ticks_on_its_anchor_whatever_the_time_asked() -> None:
    spec = Spec(every_s=10, anchor=T0)
    assert next_after(spec, T0) == T0 + timedelta(seconds=10)
    assert next_after(spec, T0 + timedelta(seconds=3.5)) == T0 + timedelta(seconds=10)
    assert next_after(spec, T0 - timedelta(seconds=1)) == T0


def test_cron_runs_in_its_time_zone_across_a_daylight_saving_change() -> None:
    spec = Spec(cron="0 9 * * *", timezone="Europe/Berlin").check()
    before = next_after(spec, datetime(2026, 3, 28, 12, 0, tzinfo=UTC))  # Saturday: CET (UTC+1)
    after = next_after(spec, before)  # Sunday 29 March: CEST (UTC+2)
    assert before == datetime(2026, 3, 29, 7, 0, tzinfo=UTC) and after == datetime(2026, 3, 30, 7, 0, tzinfo=UTC)


def test_catch_up_after_downtime_fires_all_the_latest_or_none() -> None:
    down = T0 + timedelta(seconds=95)  # ticks at 0, 10, ..., 90 were missed
    assert due(Spec(every_s=10, anchor=T0, catch_up="all"), "s", T0, down).fire == [
        T0 + timedelta(seconds=10 * i) for i in range(10)]
    latest = due(Spec(every_s=10, anchor=T0, catch_up="latest"), "s", T0, down)
    assert latest.fire == [T0 + timedelta(seconds=90)] and latest.skipped == 9
    assert latest.next_at == T0 + timedelta(seconds=100)
    hour_late = T0 + timedelta(hours=1, seconds=5)
    none = due(Spec(every_s=600, anchor=T0, catch_up="none"), "s", T0, hour_late)
    assert none.fire == [T0 + timedelta(hours=1)] and none.skipped == 6  # on time: fires; the rest: skipped
    assert len(due(Spec(every_s=1, anchor=T0, catch_up="all"), "s", T0, T0 + timedelta(days=1)).fire) == MAX_CATCH_UP


def test_nothing_is_due_before_its_tick_and_its_jitter() -> None:
    spec = Spec(every_s=60, anchor=T0, jitter_s=30)
    late = jitter(spec, "s", T0)
    assert timedelta(0) <= late < timedelta(seconds=30) and late == jitter(spec, "s", T0)  # every scheduler agrees
    assert due(spec, "s", T0, T0 + late - timedelta(microseconds=1)).fire == []
    assert due(spec, "s", T0, T0 + late).fire == [T0]


@given(st.floats(min_value=1, max_value=86400), st.integers(min_value=0, max_value=10**7))
def test_interval_ticks_are_strictly_after_and_at_most_one_interval_on(every: float, offset: int) -> None:
    spec = Spec(every_s=every, anchor=T0)
    at = T0 + timedelta(seconds=offset)
    tick = next_after(spec, at)
    assert at < tick <= at + timedelta(seconds=every) + timedelta(microseconds=1)


def test_a_tick_is_one_goal_id_and_a_bad_spec_is_refused() -> None:
    assert goal_id_for("nightly", T0) == "schedule:nightly:2026-03-01T12:00:00Z"
    for bad in (Spec(), Spec(cron="* * * * *", every_s=5), Spec(every_s=0.5), Spec(cron="61 * * * *"),
                Spec(every_s=5, timezone="Mars/Olympus"), Spec(every_s=5, catch_up="some"),  # type: ignore[arg-type]
                Spec(every_s=5, jitter_s=-1)):
        with pytest.raises(ConfigurationError):
            bad.check()
