"""A run's end delivered by the observer (``run.completed``): the Result to every reply it owes, the public notice. When
the end owes nobody anything (no reply asked for, no parent, no child, no thread), the handling writes nothing, so it
leaves no dedupe mark either: one round trip, the read of the replies owed (issue 23). A mark with an empty outbox
guarded nothing: a second delivery would publish the notice before finding it, as it does without it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from agentfleet.config.settings import get_settings
from agentfleet.events.contracts import Goal
from agentfleet.events.envelope import EventType
from agentfleet.loop.keys import derived_event_id
from agentfleet.roles.admission import goal_event
from agentfleet.store import tables as T
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import AmqpClient, count_round_trips, wait_for_run

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(distributed_env: dict[str, str]) -> Iterator[InProcessFleet]:
    with InProcessFleet(get_settings()) as running:
        yield running


def _end_marks(fleet: InProcessFleet, run_id: str) -> list[str]:
    """The observer's dedupe marks of the run's end."""
    ended = derived_event_id(run_id, EventType.RUN_COMPLETED, "ended")
    marks = T.processed_events.c
    with fleet.store.engine.connect() as conn:
        return list(conn.execute(select(marks.consumer).where(marks.event_id == ended)).scalars())


def test_an_end_owed_to_nobody_is_one_round_trip_and_leaves_no_mark(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = count_round_trips(monkeypatch, "observer", "run.completed")
    run = wait_for_run(fleet.store, fleet.submit({"agent": "modest", "input": {}}))
    assert run.result and run.result["status"] == "succeeded", run.result
    assert list(counted.settled(handlings=1).values()) == [1], counted
    assert _end_marks(fleet, run.run_id) == []


def test_an_end_that_owes_a_reply_marks_it_sent_with_its_dedupe_mark(
        fleet: InProcessFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = count_round_trips(monkeypatch, "observer", "run.completed")
    client = AmqpClient()
    try:
        goal = Goal(agent="modest", input={}, goal_id=f"end-{uuid.uuid4().hex}")
        event = goal_event(goal, reply_to=client.reply_queue, correlation_id="c1")
        fleet.runtime.publisher.publish([event])
        run = wait_for_run(fleet.store, event.run_id)
        reply = client.replies(1, timeout=30).get("c1")
    finally:
        client.close()
    assert reply is not None and reply["status"] == "succeeded", reply
    # The replies owed read; then marked sent, with the mark, in the COMMIT's round trip.
    assert list(counted.settled(handlings=1).values()) == [2], counted
    assert _end_marks(fleet, run.run_id) == ["observer"]
    assert fleet.store.pending_replies(run.run_id) == []
