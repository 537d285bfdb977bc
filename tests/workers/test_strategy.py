"""How a worker takes an event task's message: the fleet's short way, or Celery's where it must (workers/strategy.py).

The short way must look, from outside, like Celery's: ``inspect active`` counts a handling in flight and shows only
its reprs; a message is acked, rejected or sent back as Celery would for the outcome; and where something needs
Celery's ``Request`` (task events, a task signal's receiver) every message takes Celery's way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from celery import signals

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.events.topology import Topology
from agentfleet.loop.states import RunState
from agentfleet.ops.control import live_workers
from agentfleet.workers import strategy
from agentfleet.workers.app import create_app
from tests.conftest import BROKER_URL, WorkerProcs
from tests.helpers import AmqpClient, embedded_fleet, eventually, tool_started, wait_for_run

GOAL = {"agent": "fanout", "input": {}}
EVENTS = {"goal.submitted", "tool.requested", "tool.completed", "observation.recorded"}


@pytest.fixture
def short_way(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The event types handled the short way, in order."""
    taken: list[str] = []
    run = strategy._Handling.run

    def counted(self: strategy._Handling) -> None:
        taken.append(self.name)
        run(self)

    monkeypatch.setattr(strategy._Handling, "run", counted)
    yield taken


def test_a_fleet_takes_its_events_the_short_way(tmp_path: Path, short_way: list[str]) -> None:
    with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
        run = wait_for_run(fleet.store, fleet.submit(GOAL))
    assert run.state == RunState.SUCCEEDED
    assert set(short_way) >= EVENTS


def test_with_a_task_signal_listened_to_every_event_takes_celerys_way(tmp_path: Path, short_way: list[str]) -> None:
    """An instrumentation that hooks Celery's task signals (``task_prerun``) keeps seeing every task."""
    seen: list[str] = []

    def prerun(sender: Any = None, **_: Any) -> None:
        seen.append(sender.name)

    signals.task_prerun.connect(prerun, weak=False)
    try:
        with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
            run = wait_for_run(fleet.store, fleet.submit(GOAL))
    finally:
        signals.task_prerun.disconnect(prerun)
    assert run.state == RunState.SUCCEEDED
    assert set(seen) >= EVENTS and short_way == []


@pytest.mark.integration
def test_a_handling_in_flight_is_active_to_inspect_and_shows_no_payload(
        workers: WorkerProcs, namespace: str, tmp_path: Path) -> None:
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    app = create_app(Settings(broker_url=BROKER_URL, namespace=namespace))
    client = AmqpClient()
    corr = client.publish_goal(namespace, "goal.slow_side_effect", {"agent": "slow_side_effect", "input": {}})
    tool_started(tmp_path)  # the tool sleeps 4 s
    executor = workers.name(C.EXECUTOR, C.ROLES.index(C.EXECUTOR))
    active = app.control.inspect(destination=[executor], timeout=5).active() or {}
    [handling] = active[executor]
    assert handling["name"] == "tool.requested" and handling["acknowledged"] is False and handling["time_start"]
    assert handling["kwargs"].startswith("{'envelope': <tool.requested run=") and "once" not in str(handling)
    assert {w.name: w.active for w in live_workers(app, Topology(namespace))}[executor] == 1
    result = client.replies(1, timeout=60).get(corr)
    assert result is not None and result["status"] == "succeeded", workers.logs()
    eventually(lambda: not (app.control.inspect(destination=[executor], timeout=5).active() or {}).get(executor),
               message="the handling leaves inspect's active list")
    client.close()


OBSERVED = {"task": "observation.recorded", "lang": "py"}
# (name, body, headers, content type): task messages of a real event type that no handler takes.
HOSTILE: list[tuple[str, bytes, dict[str, Any], str]] = [
    ("positional arguments", b'[[1, 2, 3], {}, {}]', {**OBSERVED, "id": "odd-1"}, "application/json"),
    ("an argument the task does not take", b'[[], {"bogus": 1}, {}]', {**OBSERVED, "id": "odd-2"}, "application/json"),
    ("options not a mapping", b'[[], {}, []]', {**OBSERVED, "id": "odd-3"}, "application/json"),
    ("not [args, kwargs, options]", b'{}', {**OBSERVED, "id": "odd-4"}, "application/json"),
    ("no id", b'[[], {"envelope": {}}, {}]', OBSERVED, "application/json"),
    ("an id that is not a string", b'[[], {"envelope": {}}, {}]', {**OBSERVED, "id": ["not", "an", "id"]},
     "application/json"),
    # A compression header kombu cannot undo over a body that would decode: Celery's consumer refuses it (its
    # decode raises what decompressing raised), and so must the short way, not run the raw body.
    ("a compression nobody knows", b'[[], {"envelope": {}}, {}]',
     {**OBSERVED, "id": "odd-7", "compression": "application/x-made-up"}, "application/json"),
    ("pickle", b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00}\x94.", {**OBSERVED, "id": "odd-8"},
     "application/x-python-serialize"),
]


@pytest.mark.integration
def test_every_task_message_no_handler_takes_is_rejected_to_the_dead_letters_and_the_workers_go_on(
        workers: WorkerProcs, namespace: str) -> None:
    """Arguments the task does not take, a body that is not [args, kwargs, options], no id, a compression or content
    type the fleet does not accept: each rejected (the broker says so in x-death), not acked away, not run; and the
    workers go on."""
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    client = AmqpClient()
    for name, body, headers, content_type in HOSTILE:
        client.channel.basic_publish(
            exchange=f"{namespace}.events", routing_key="observation.recorded", body=body,
            properties=pika.BasicProperties(content_type=content_type, content_encoding="utf-8", delivery_mode=2,
                                            headers=headers, message_id=name))
    dead = client.drain(f"{namespace}.dead", len(HOSTILE), timeout=30)
    kept = {props.message_id: (props, body) for props, body in dead}
    for name, body, _, _ in HOSTILE:
        assert name in kept, (name, sorted(kept), workers.logs()[-3000:])
        props, came = kept[name]
        assert came == body and props.headers.get("x-death", [{}])[0].get("reason") == "rejected", (name, props)
    corr = client.publish_goal(namespace, "goal.fanout", GOAL)
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", workers.logs()[-3000:]
    assert all(p.poll() is None for _, p in workers.procs)
