"""Every internal event delivered twice: the run ends the same and no tool runs twice."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from agentfleet.config.settings import get_settings
from agentfleet.events.envelope import Envelope, decode
from agentfleet.events.publisher import Publisher
from agentfleet.store import tables as T
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import wait_for_run

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(distributed_env: dict[str, str]) -> Iterator[InProcessFleet]:
    with InProcessFleet(get_settings()) as running:
        yield running


def wait_until_drained(fleet: InProcessFleet, quiet_s: float = 1.0, timeout: float = 30.0) -> None:
    """Until every role queue has been empty (nothing ready, nothing unacked) for ``quiet_s``."""
    import time

    queues = list(fleet.runtime.topology.role_queues.values())
    deadline = time.monotonic() + timeout
    quiet_since = None
    with fleet.app.connection_for_read() as conn:
        channel = conn.default_channel
        while time.monotonic() < deadline:
            busy = 0
            for queue in queues:
                _, ready, _ = channel.queue_declare(queue.name, passive=True)
                busy += ready
            if busy == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= quiet_s:
                    return
            else:
                quiet_since = None
            time.sleep(0.05)
    raise TimeoutError("role queues did not drain")


def snapshot(fleet: InProcessFleet, run_id: str) -> dict[str, object]:
    run = fleet.store.get_run(run_id)
    assert run is not None
    steps = [(s["kind"], s["iteration"], s["call_id"], s["status"], s["attempts"], s["output"])
             for s in fleet.store.steps(run_id)]
    return {"state": run.state, "iteration": run.iteration, "usage": run.usage, "result": run.result,
            "steps": sorted(steps, key=str), "transcript": fleet.store.transcript(run_id)}


def stored_events(fleet: InProcessFleet, run_id: str) -> list[Envelope]:
    """What the run's handlings stored to publish (only this run's: other tests share the database)."""
    from sqlalchemy import select

    with fleet.store.engine.connect() as conn:
        rows = conn.execute(select(T.processed_events.c.outbox).where(T.processed_events.c.run_id == run_id)).all()
    return [e for e in (decode(e) for row in rows for e in row.outbox) if e.run_id == run_id]


def test_every_event_published_twice_changes_nothing(fleet: InProcessFleet, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    original = Publisher.publish
    published: list[str] = []

    def twice(self: Publisher, envelopes: Iterable[Envelope], *, resent: bool = False) -> None:
        batch = list(envelopes)
        published.extend(e.event_id for e in batch)
        original(self, batch, resent=resent)
        original(self, batch, resent=resent)

    monkeypatch.setattr(Publisher, "publish", twice)
    run_id = fleet.submit({"agent": "ledger", "input": {}})
    # Not a speed check: what is asserted is that nothing changed twice. (Each duplicate republishes its stored
    # outbox, itself twice here. This storm took 36 to 126 s to settle, and a step once sat behind its lock past 60
    # s: the publisher lost confirms read while a batch was still being sent, and waited 30 s for each. Now ~6 s.)
    record = wait_for_run(fleet.store, run_id, timeout=180)
    assert record.result and record.result["status"] == "succeeded", record.result
    # Every event of the run went out twice (plan, 7 tool calls, 7 results, 2 observations, the end).
    assert len(published) >= 17

    lines = (tmp_path / f"ledger-{run_id}.txt").read_text().splitlines()
    assert sorted(line.split(":")[1] for line in lines) == ["four", "one", "three", "two"]
    steps = fleet.store.steps(run_id)
    assert all(s["attempts"] == 1 for s in steps), steps
    assert record.steps_used == 3

    # And replaying the whole recorded history once more, after the end, changes nothing. The doubled copies still
    # in the queues go first.
    wait_until_drained(fleet, timeout=180)
    before = snapshot(fleet, run_id)
    monkeypatch.setattr(Publisher, "publish", original)
    history = stored_events(fleet, run_id)
    assert len(history) >= 17
    fleet.runtime.publisher.publish(history)  # one batch of every event: confirmed together
    wait_until_drained(fleet)
    assert snapshot(fleet, run_id) == before
    with fleet.app.connection_for_read() as conn:  # and no copy of any event failed for good on the way
        dead = fleet.runtime.topology.dead_queue
        assert dead.bind(conn.default_channel).queue_declare(passive=True).message_count == 0
    assert len((tmp_path / f"ledger-{run_id}.txt").read_text().splitlines()) == 4
