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


def test_every_confirm_of_a_batch_is_counted_even_when_the_broker_answers_while_it_is_still_being_sent(
        publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> None:
    """py-amqp reads what the broker sent before each publish (to notice a blocked connection): a confirm for an
    earlier message of the batch, read then, went to the channel's listeners and not to the batch's wait, which then
    waited for it until CONFIRM_TIMEOUT_S (30 s) and sent the whole batch again. Seen as 23 of 240 batches from six
    threads stalling 30 to 90 s, and a duplicate delivery test spending 60 s in one publish. A batch is sent here
    without the publisher's retry: a confirm it missed is a timeout."""
    import threading

    from agentfleet.events import publisher as module

    monkeypatch.setattr(module, "CONFIRM_TIMEOUT_S", 10.0)  # far above a confirm's milliseconds: a lost one waits
    failures: list[BaseException] = []

    def send(thread: int) -> None:
        for i in range(12):
            batch = [requested(thread * 100 + i * 10 + k) for k in range(2 + i % 5)]
            messages = []
            for env in batch:  # the publisher's own message building, through one real publish call per batch
                task = publisher.app.amqp.as_task_v2(env.event_id, str(env.type), kwargs={"envelope": env.wire()})
                messages.append((task.body, dict(exchange=publisher.topology.events.name, routing_key=str(env.type),
                                                  headers=task.headers, serializer="json", delivery_mode=2,
                                                  **task.properties)))
            try:
                with publisher.app.producer_or_acquire() as producer:
                    module._confirmed_batch(producer, messages)  # not retried: a missed confirm fails
            except BaseException as exc:  # reported below, with the rest
                failures.append(exc)
                return

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_a_channels_confirms_are_counted_in_any_order_and_a_refusal_names_only_what_was_not_confirmed() -> None:
    from agentfleet.events.publisher import _BatchChannel

    own = object.__new__(_BatchChannel)  # the bookkeeping alone: no channel
    own.published, own.through, own.acked, own.nacked = 6, 0, set(), set()
    for tag in (2, 3, 1):  # out of order, one by one
        own._ack(tag)
    assert (own.through, own.acked) == (3, set())
    own._ack(5)
    own._nack(6, multiple=True)  # "every unconfirmed tag up to 6": 4 and 6, not 5
    assert own.refused(4, 6) == [4, 6] and own.nacked == set()
    own._ack(6, multiple=True)
    assert (own.through, own.acked) == (6, set())  # nothing kept that a later ack covers


def test_an_event_message_sends_only_the_celery_headers_that_say_something_and_a_worker_reads_the_same_task(
        publisher: Publisher, namespace: str) -> None:
    """py-amqp frames every header in Python, and Celery's protocol 2 has nineteen, most at the value a worker takes
    when one is absent (``shadow``, ``eta``, ``expires``, ``group``, ``retries``, ``timelimit``, ``stamps``…): framing
    them was a third of a publish's CPU. Only the ones that say something are sent; Celery's own ``Request``, built
    from the message as its worker builds it, reads the task exactly as from the full set."""
    from celery.worker.request import Request
    from kombu import Queue

    env = requested(0)
    publisher.publish([env])
    with Connection(BROKER_URL) as conn:
        queue = Queue(Topology(namespace).queue_for(EventType.TOOL_REQUESTED).name, channel=conn.default_channel)
        message = queue.get(no_ack=True)
        assert message is not None and queue.get(no_ack=True) is None
        sent = dict(message.headers)
        assert set(sent) == {"lang", "task", "id", "root_id", "argsrepr", "kwargsrepr", "origin", "ignore_result"}
        app = publisher.app
        task = app.tasks["tool.requested"]
        lean = Request(message, app=app, task=task)
        full = Request(message, app=app, task=task, headers=app.amqp.as_task_v2(
            env.event_id, str(env.type), kwargs={"envelope": env.wire()}, argsrepr=sent["argsrepr"],
            kwargsrepr=sent["kwargsrepr"], root_id=sent["root_id"], ignore_result=True, origin=sent["origin"]).headers)
    read = ("id", "name", "root_id", "parent_id", "argsrepr", "kwargsrepr", "eta", "expires", "time_limits",
            "ignore_result", "replaced_task_nesting", "stamped_headers", "stamps", "args", "kwargs", "reply_to",
            "correlation_id", "delivery_info")
    def seen(request: Request) -> dict:  # the limits come as the message's list, or as the worker's default tuple
        return {k: getattr(request, k) for k in read} | {"time_limits": tuple(request.time_limits)}

    assert seen(lean) == seen(full)
    assert {k: lean.request_dict.get(k) or None for k in ("retries", "group", "group_index", "shadow", "timelimit")} \
        == dict.fromkeys(("retries", "group", "group_index", "shadow", "timelimit"))
    assert Envelope.model_validate(lean.kwargs["envelope"]).event_id == env.event_id


def _pool_acquisitions(publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every producer taken from kombu's pool from now on (counted, still taken)."""
    taken: list[int] = []
    pool = publisher.app.producer_pool
    acquire = pool.acquire
    monkeypatch.setattr(pool, "acquire", lambda *a, **kw: (taken.append(1), acquire(*a, **kw))[1])
    return taken


def test_a_publisher_keeps_its_producers_bound_and_takes_none_from_kombus_pool_once_warm(
        publisher: Publisher, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's pool gives a producer's connection back on every release: each publish took a connection, a channel
    promise and a copy of the exchange again, 58 µs of CPU of a 295 µs publish. The publisher's own producers keep
    theirs between publishes, single events and batches alike."""
    events = [requested(i) for i in range(9)]
    publisher.publish(events[:1])  # warm: the thread's producer made and connected
    taken = _pool_acquisitions(publisher, monkeypatch)
    for event in events[1:5]:
        publisher.publish([event])
    publisher.publish(events[5:])
    assert taken == []
    assert sorted(h["id"] for h, _ in drain(namespace)) == sorted(e.event_id for e in events)


def test_a_kept_producer_whose_connection_broke_publishes_on_a_new_one_and_nothing_is_lost(
        publisher: Publisher, namespace: str) -> None:
    """The broker may close a connection a producer kept (a restart, a missed heartbeat): the next publish finds out
    writing or waiting for its confirm, and kombu's retry sends it again on a new connection."""
    import socket

    events = [requested(i) for i in range(4)]
    publisher.publish(events[:1])
    for kept in publisher.producers.idle():
        kept.connection.connection.sock.shutdown(socket.SHUT_RDWR)  # as if the broker had gone
    publisher.publish(events[1:2])
    publisher.publish(events[2:])
    ids = [h["id"] for h, _ in drain(namespace)]
    assert set(ids) == {e.event_id for e in events}  # a retried one may come twice: consumers dedupe


def test_a_publish_past_the_producers_kept_goes_through_kombus_pool_and_threads_at_once_all_arrive(
        publisher: Publisher, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most ``KEPT_PRODUCERS`` connections of the publisher's own: a publish that finds none free uses kombu's
    pool, as every publish did before, and waits for no other's producer."""
    import threading

    from agentfleet.events import publisher as module

    monkeypatch.setattr(module, "KEPT_PRODUCERS", 2)
    fresh = Publisher(publisher.app, publisher.topology)
    taken = _pool_acquisitions(fresh, monkeypatch)
    first = [requested(0), requested(1), requested(2)]
    with fresh.producers.acquire(), fresh.producers.acquire():
        fresh.publish(first[:1])  # both kept ones in use
        assert len(taken) == 1 and fresh.producers.made == 2
    fresh.publish(first[1:2])
    assert len(taken) == 1 and len(fresh.producers.idle()) == 2

    sent = {thread: [requested(thread * 100 + i) for i in range(10)] for thread in range(1, 7)}

    def send(thread: int) -> None:
        for event in sent[thread]:
            fresh.publish([event])

    threads = [threading.Thread(target=send, args=(n,)) for n in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [*first[:2], *(e for events in sent.values() for e in events)]
    assert sorted(h["id"] for h, _ in drain(namespace)) == sorted(e.event_id for e in expected)
    assert fresh.producers.made <= 2
    fresh.close()  # the runtime's close: its connections let go; used again, it makes new ones
    assert fresh.producers.made == 0 and fresh.producers.idle() == []
    fresh.publish(first[2:])
    assert [h["id"] for h, _ in drain(namespace)] == [first[2].event_id]


@pytest.mark.parametrize("text", ["plain", "é\u2028 \x00", "\udfff"], ids=["ascii", "unicode", "lone-surrogate"])
def test_an_event_messages_body_is_celerys_protocol_2_body_of_the_envelope_whatever_its_text(text: str) -> None:
    """The body is written straight from the envelope's model (one pass in pydantic's serializer, not a dict and then
    the json module); what a worker decodes is what kombu would have encoded. Text JSON cannot carry as UTF-8 (a lone
    surrogate) takes the json module's way, escaped, as before."""
    from kombu.utils.json import dumps, loads

    from agentfleet.events.envelope import ToolFinished
    from agentfleet.events.publisher import task_body
    from agentfleet.loop.transcript import ToolResult

    env = Envelope.new(EventType.TOOL_COMPLETED, "run-body", ToolFinished(
        agent="a", iteration=0, call_id="c", tool="echo", sibling_call_ids=["c"],
        result=ToolResult(ok=True, output={"text": text, "f": 1e-5, "n": 10**30})), trace_id="t")
    body = task_body(env)
    assert isinstance(body, bytes)
    expected = [[], {"envelope": env.wire()}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    assert loads(body) == loads(dumps(expected))
