"""What the console hears on ``<ns>.public`` is input: anything a publisher put there is read strictly, and a page
that stops reading its stream is dropped notices, never memory."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentfleet.console.live import SUBSCRIBER_BACKLOG, Heard, Subscription


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b"null", json.dumps({"type": 7}).encode(),
                                 json.dumps({"run_id": "r"}).encode(), b"\xff\xfe", None, 12])
def test_a_notice_that_is_not_one_is_ignored(raw: object) -> None:
    assert Heard.of(raw) is None


def test_only_the_type_and_the_ids_cross_over_and_odd_ids_are_dropped() -> None:
    heard = Heard.of(json.dumps({"type": "approval.requested" + "x" * 500, "run_id": "r1", "trace_id": ["t"],
                                 "arguments": {"token": "s3cret"}}).encode())
    assert heard == Heard(type=("approval.requested" + "x" * 500)[:64], run_id="r1", trace_id=None)


def test_a_stream_that_falls_behind_loses_notices_not_memory() -> None:
    async def flood() -> int:
        sub = Subscription(asyncio.get_running_loop())
        for i in range(SUBSCRIBER_BACKLOG * 3):
            sub.offer(Heard(type=f"run.{i}"))
        return sub.queue.qsize()

    assert asyncio.run(flood()) == SUBSCRIBER_BACKLOG


def test_many_pages_of_one_view_cost_one_look_a_second() -> None:
    from agentfleet.console.streams import SharedLooks

    looks = SharedLooks(fresh_s=60)
    calls: list[int] = []

    def look(store: object) -> int:
        calls.append(1)
        return len(calls)

    assert [looks.look("runs", None, look) for _ in range(100)] == [1] * 100  # type: ignore[arg-type]
    assert looks.look("approvals", None, look) == 2  # type: ignore[arg-type]
    assert looks.peek("runs") == 1 and looks.peek("nothing") is None
    assert SharedLooks(fresh_s=0).look("runs", None, look) == 3  # type: ignore[arg-type]


def _feed_runtime(broker_url: str, namespace: str) -> object:
    """What the feed reads of a runtime: its settings and topology (the broker itself is real, or really absent)."""
    from types import SimpleNamespace

    from agentfleet.config.settings import Settings
    from agentfleet.events.topology import Topology

    return SimpleNamespace(settings=Settings(broker_url=broker_url, namespace=namespace), topology=Topology(namespace))


def test_a_feed_whose_broker_is_away_keeps_trying_and_stops_when_told() -> None:
    import time

    from agentfleet.console.live import PublicFeed

    feed = PublicFeed(_feed_runtime("amqp://guest:guest@127.0.0.1:1//", "aftest-nobroker"))  # type: ignore[arg-type]
    feed.start()
    time.sleep(0.5)
    assert feed._thread is not None and feed._thread.is_alive() and not feed.connected.is_set()
    started = time.monotonic()
    feed.stop()
    assert not feed._thread.is_alive() and time.monotonic() - started < 5


@pytest.mark.integration
@pytest.mark.chaos
def test_the_feed_hears_again_after_the_broker_restarts(namespace: str) -> None:
    import subprocess
    import uuid

    from kombu import Connection, Producer

    from agentfleet.console.live import PublicFeed
    from agentfleet.testing.chaos import _broker_restart
    from tests.conftest import BROKER_URL
    from tests.helpers import eventually

    restart = _broker_restart()
    if restart is None:
        pytest.fail("rabbitmqctl is needed to restart the broker")
    rt = _feed_runtime(BROKER_URL, namespace)
    feed = PublicFeed(rt)  # type: ignore[arg-type]

    def say(run_id: str) -> None:
        with Connection(BROKER_URL) as conn:
            Producer(conn).publish({"type": "run.completed", "run_id": run_id}, exchange=rt.topology.public,  # type: ignore[attr-defined]
                                   routing_key="run.completed", serializer="json")

    async def hear(run_id: str) -> Heard:
        sub = feed.subscribe()
        try:
            await asyncio.to_thread(say, run_id)
            while True:
                heard = await asyncio.wait_for(sub.queue.get(), timeout=30)
                if heard is not None and heard.run_id == run_id:
                    return heard
        finally:
            feed.unsubscribe(sub)

    feed.start()
    try:
        eventually(feed.connected.is_set, timeout=30, message="the feed is connected")
        before = uuid.uuid4().hex
        assert asyncio.run(hear(before)).run_id == before
        stop, *start = restart
        subprocess.run(stop, check=True, capture_output=True, timeout=180)
        eventually(lambda: not feed.connected.is_set(), timeout=30, message="the feed saw the broker go")
        for command in start:
            subprocess.run(command, check=True, capture_output=True, timeout=180)
        eventually(feed.connected.is_set, timeout=60, message="the feed is connected again")
        after = uuid.uuid4().hex
        assert asyncio.run(hear(after)) == Heard(type="run.completed", run_id=after)
    finally:
        feed.stop()
