"""The publisher on the real broker: event messages are Celery's own task messages, a batch is confirmed as one,
and nothing of a batch is lost or sent twice when all goes well."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kombu import Connection

from agentfleet.config.settings import Settings
from agentfleet.events.envelope import Envelope, EventType, ToolRequested
from agentfleet.events.publisher import Publisher, _batch_channels
from agentfleet.events.topology import Topology
from agentfleet.loop.transcript import ToolCall
from agentfleet.workers.app import create_app
from tests.conftest import BROKER_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def publisher(namespace: str) -> Iterator[Publisher]:
    from kombu import pools

    pools.reset()  # kombu's pool is process-wide: a connection an earlier test left idle may be one the broker closed
    app = create_app(Settings(profile="distributed", broker_url=BROKER_URL, namespace=namespace))
    with app.connection_for_write() as conn:
        Topology(namespace).declare(conn)
    yield Publisher(app, Topology(namespace))


def requested(i: int) -> Envelope:
    call = ToolCall(id=f"c{i}", name="noop", arguments={"step": i})
    return Envelope.new(EventType.TOOL_REQUESTED, "run-pub", ToolRequested(
        agent="a", iteration=0, call=call, sibling_call_ids=[f"c{i}" for i in range(8)], idempotency_key=f"k{i}"),
        trace_id="t")


def drain(namespace: str) -> list[tuple[dict, dict]]:
    """Every message waiting in the executor's queue: (headers, body)."""
    out = []
    with Connection(BROKER_URL) as conn:
        channel = conn.default_channel
        queue = Topology(namespace).queue_for(EventType.TOOL_REQUESTED).name
        while (message := channel.basic_get(queue)) is not None:
            out.append((dict(message.headers), json.loads(message.body)))
            channel.basic_ack(message.delivery_tag)
    return out


def test_a_batch_of_events_is_confirmed_together_and_arrives_once_each_as_celery_tasks(
        publisher: Publisher, namespace: str) -> None:
    events = [requested(i) for i in range(8)]
    # Counted per channel: another test's channel may be collected (a weak key) while this one runs.
    alive = list(_batch_channels.values())  # keeps each id below unique while the test runs
    before = {id(c): c.published for c in alive}
    publisher.publish(events)
    publisher.publish(events[:1])  # one alone, on the same pooled connection, after the batch
    publisher.publish(events[1:3])  # and a batch after that: the counted channel's tags still line up
    published = sum(c.published - before.get(id(c), 0) for c in _batch_channels.values())
    assert published == 10, "both batches went on a counted channel"
    got = drain(namespace)
    ids = [headers["id"] for headers, _ in got]
    sent = [*events, events[0], *events[1:3]]
    assert sorted(ids) == sorted(e.event_id for e in sent)
    for headers, body in got:  # Celery's protocol 2: the task is the event type, the one kwarg the envelope
        args, kwargs, embed = body
        assert headers["task"] == "tool.requested" and args == [] and set(embed) >= {"callbacks", "chain"}
        assert Envelope.model_validate(kwargs["envelope"]).event_id == headers["id"]
        assert "noop" not in headers["kwargsrepr"] and "step" not in headers["kwargsrepr"]  # no payload in Flower
