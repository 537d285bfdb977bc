"""Which schedules a scheduler's pass finds due, on both databases: the pass's first read (a prebuilt statement,
asked every second in every observer) must agree with the held read that follows it."""

from __future__ import annotations

import uuid
from datetime import timedelta

from agentfleet.ops.schedules import add_schedule
from agentfleet.store import Store
from agentfleet.store.records import now


def test_a_pass_finds_the_due_and_unpaused_and_nothing_before_it_is_due(store: Store) -> None:
    # Paused from the start, and their ticks an hour out: the session's database is shared with fleets that fire.
    tag = uuid.uuid4().hex[:8]
    later, held, soon = (f"{name}-{tag}" for name in ("later", "held", "soon"))
    add_schedule(store, later, "tidy", {}, every_s=3600)
    add_schedule(store, held, "tidy", {}, every_s=3600, paused=True)
    add_schedule(store, soon, "tidy", {}, every_s=3000)
    try:
        def due(at_minutes: int) -> list[str]:
            with store.due_schedules(now() + timedelta(minutes=at_minutes), 1000) as (_, rows):
                return sorted(r["schedule_id"] for r in rows if r["schedule_id"].endswith(tag))

        assert due(0) == []  # the first ticks are 50 and 60 minutes away
        assert due(55) == [soon]
        assert due(65) == [later, soon]
    finally:
        for name in (later, held, soon):
            store.delete_schedule(name)
