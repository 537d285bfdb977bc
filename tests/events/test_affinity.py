"""A run's next event goes back to the process of its role that holds the run, on the real broker: observations to
the planner that planned the iteration, tool results to the observer that moved the run last. To that process's own
queue while it is there, to the role queue (any process of the role) when it is not, and never lost on the way."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator

import pytest
from celery.app.task import Context
from kombu import Connection

from agentfleet import constants as C
from agentfleet.config.settings import Settings, get_settings
from agentfleet.events.envelope import Envelope, EventType, ObservationRecorded, ToolFinished
from agentfleet.events.publisher import Publisher
from agentfleet.events.topology import OWN_QUEUE_WAIT_MS, Topology
from agentfleet.loop.transcript import ToolResult
from agentfleet.workers.app import create_app
from agentfleet.workers.embedded import InProcessFleet
from agentfleet.workers.event_task import was_redelivered
from tests.conftest import BROKER_URL
from tests.helpers import eventually, wait_for_run

pytestmark = pytest.mark.integration


@pytest.fixture
def publisher(namespace: str) -> Iterator[Publisher]:
    from kombu import pools

    pools.reset()  # kombu's pool is process-wide: a connection an earlier test left idle may be one the broker closed
    app = create_app(Settings(profile="distributed", broker_url=BROKER_URL, namespace=namespace))
    topology = Topology(namespace)
    with app.connection_for_write() as conn:
        topology.declare(conn)
        for role, token in OWN:
            topology.own_queue(role, token).bind(conn.default_channel).declare()
    yield Publisher(app, topology)
    with Connection(BROKER_URL) as conn:
        for role, token in OWN:
            topology.own_queue(role, token).bind(conn.default_channel).delete()


OWN = [(C.PLANNER, "p1"), (C.PLANNER, "p2"), (C.OBSERVER, "o1")]


def observation(planner: str | None) -> Envelope:
    return Envelope.new(EventType.OBSERVATION_RECORDED, "run-affinity",
                        ObservationRecorded(agent="a", iteration=0, observations=[], planner=planner, observer="o1"),
                        trace_id="t")


def finished(event_type: EventType, observer: str | None) -> Envelope:
    return Envelope.new(event_type, "run-affinity", ToolFinished(
        agent="a", iteration=1, call_id="c", tool="t", sibling_call_ids=["c"], result=ToolResult(ok=True),
        planner="p1", observer=observer), trace_id="t")


def taken(queue: str) -> list[tuple[dict, Envelope]]:
    """Every message waiting in ``queue``, taken: (headers, the envelope)."""
    import json

    out = []
    with Connection(BROKER_URL) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(queue)) is not None:
            _args, kwargs, _embed = json.loads(message.body)
            out.append((dict(message.headers), Envelope.model_validate(kwargs["envelope"])))
            channel.basic_ack(message.delivery_tag)
    return out


def waiting(queue: str) -> int:
    with Connection(BROKER_URL) as conn:
        return conn.default_channel.queue_declare(queue, passive=True).message_count


def test_an_observation_goes_to_the_queue_of_the_planner_that_planned_its_run(
        publisher: Publisher, namespace: str) -> None:
    topology = Topology(namespace)
    to_p1, to_p2, to_anyone = observation("p1"), observation("p2"), observation(None)
    publisher.publish([to_p1, to_p2, to_anyone])
    got = {token: taken(topology.own_queue(role, token).name) for role, token in OWN}
    assert got["o1"] == []  # the observer named on an observation is for the next call, not for this
    assert [env.event_id for _, env in got["p1"]] == [to_p1.event_id]
    assert [env.event_id for _, env in got["p2"]] == [to_p2.event_id]
    headers, _ = got["p1"][0]
    assert headers["task"] == "observation.recorded" and headers["id"] == to_p1.event_id  # Celery's task, as ever
    assert [env.event_id for _, env in taken(topology.role_queues[C.PLANNER].name)] == [to_anyone.event_id]


def test_a_tool_result_goes_to_the_queue_of_the_observer_that_moved_its_run_last(
        publisher: Publisher, namespace: str) -> None:
    topology = Topology(namespace)
    done, failed, to_anyone = (finished(EventType.TOOL_COMPLETED, "o1"), finished(EventType.TOOL_FAILED, "o1"),
                               finished(EventType.TOOL_COMPLETED, None))
    publisher.publish([done, failed, to_anyone])
    got = taken(topology.own_queue(C.OBSERVER, "o1").name)
    assert sorted(env.event_id for _, env in got) == sorted([done.event_id, failed.event_id])
    assert {headers["task"] for headers, _ in got} == {"tool.completed", "tool.failed"}
    assert taken(topology.own_queue(C.PLANNER, "p1").name) == []  # the planner named is the observation's
    assert [env.event_id for _, env in taken(topology.role_queues[C.OBSERVER].name)] == [to_anyone.event_id]


def test_an_observation_for_a_planner_with_no_queue_goes_to_the_role_queue(
        publisher: Publisher, namespace: str) -> None:
    """A planner gone long enough for its queue to go: the token matches nothing, and the planners exchange hands the
    message to its alternate, the events exchange, which routes it by type as any other."""
    topology = Topology(namespace)
    gone = observation("gone-for-good")
    publisher.publish([gone])
    assert [env.event_id for _, env in taken(topology.role_queues[C.PLANNER].name)] == [gone.event_id]


def test_an_observation_its_planner_does_not_take_moves_to_the_role_queue_after_the_wait(
        publisher: Publisher, namespace: str) -> None:
    """The planner stopped (or is busy) with the observation in its queue: after ``OWN_QUEUE_WAIT_MS`` the broker moves
    it to the role queue, whole, where any planner takes it."""
    topology = Topology(namespace)
    left = observation("p1")
    publisher.publish([left])
    own, role = topology.own_queue(C.PLANNER, "p1").name, topology.role_queues[C.PLANNER].name
    eventually(lambda: waiting(role) == 1, timeout=OWN_QUEUE_WAIT_MS / 1000 + 15, message="moved to the role queue")
    assert waiting(own) == 0
    got = taken(role)
    assert [env.event_id for _, env in got] == [left.event_id]
    headers, env = got[0]
    assert headers["task"] == "observation.recorded" and env == left
    # It was in the planner's own queue first, and left it by the wait: the broker says so (no clock read here).
    assert [(d["queue"], d["reason"]) for d in headers["x-death"]] == [(own, "expired")]
    # The move clears the broker's redelivered flag, though the planner may have died with the message in hand: the
    # fleet counts it as redelivered (a crash there counts towards max_step_attempts as any other).
    assert was_redelivered(Context(headers, delivery_info={"redelivered": False}))
    assert not was_redelivered(Context({"task": "observation.recorded"}, delivery_info={"redelivered": False}))


def test_a_copy_sent_again_from_a_stored_outbox_counts_as_redelivered(publisher: Publisher, namespace: str) -> None:
    """A stored outbox keeps no routing hints, so a copy of its events sent again (a duplicate delivery's, the
    sweeper's) goes straight to the role queue: no process's own queue, no ``x-death``, no redelivered flag. Its first
    copy may have been delivered and have crashed its worker (a model asked first, with nothing written): the copy is
    marked, and counted as redelivered, so that crash counts towards ``max_step_attempts`` as any other."""
    topology = Topology(namespace)
    first, again = observation(None), observation(None)
    publisher.publish([first])
    publisher.publish([again], resent=True)
    got = {env.event_id: headers for headers, env in taken(topology.role_queues[C.PLANNER].name)}
    assert not was_redelivered(Context(got[first.event_id], delivery_info={"redelivered": False}))
    assert was_redelivered(Context(got[again.event_id], delivery_info={"redelivered": False}))


def test_the_embedded_topology_routes_every_event_by_its_type() -> None:
    """kombu's memory transport has no headers exchange; the embedded fleet is one process anyway."""
    topology = Topology("ns", affinity=False)
    payload = observation("p1").payload
    assert topology.route(EventType.OBSERVATION_RECORDED, payload) == ("ns.events", "observation.recorded", {})
    assert topology.route(EventType.TOOL_COMPLETED, finished(EventType.TOOL_COMPLETED, "o1").payload) == (
        "ns.events", "tool.completed", {})
    assert "ns.affinity" not in [e.name for e in topology.all_exchanges()]


def test_a_fleets_planner_and_observer_get_the_events_of_the_runs_they_moved(
    distributed_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the fleet: the planner and the observer each consume a queue of their own; a call carries the planner's
    token, and from the second iteration on the observer's; the executor passes both on; the observer publishes the
    observation to that planner, with its own token for the next call.

    A handling's stored outbox keeps its events without these hints (nor the run as its sender left it): they only
    say where an event is best handled, the copy sent again for a duplicate delivery or by the sweeper goes to the
    role's queue, and the run's row is read there. Each hinted event stored is a third to half of its size."""
    published: list[Envelope] = []
    original = Publisher.publish

    def keep(self: Publisher, envelopes: Iterable[Envelope], *, resent: bool = False) -> None:
        batch = list(envelopes)
        published.extend(batch)
        original(self, batch, resent=resent)

    monkeypatch.setattr(Publisher, "publish", keep)
    with InProcessFleet(get_settings()) as fleet:
        tokens = dict(fleet.runtime.tokens)
        assert set(tokens) == {C.PLANNER, C.OBSERVER}
        with Connection(BROKER_URL) as conn:
            for role, token in tokens.items():
                own = fleet.runtime.topology.own_queue(role, token).name
                assert conn.default_channel.queue_declare(own, passive=True).consumer_count == 1
        run = wait_for_run(fleet.store, fleet.submit({"agent": "ledger", "input": {}}))
        assert run.result and run.result["status"] == "succeeded", run.result
        stored = fleet.store.stored_events(run.run_id)
    events = [e.wire() for e in published if e.run_id == run.run_id]
    planner, observer = tokens[C.PLANNER], tokens[C.OBSERVER]
    calls = {e["payload"]["call"]["id"]: e["payload"] for e in events if e["type"] == "tool.requested"}
    results = {e["payload"]["call_id"]: e["payload"] for e in events if e["type"] == "tool.completed"}
    assert len(calls) == 7 and {c["planner"] for c in calls.values()} == {planner}
    assert calls["a1"]["observer"] is None  # the first iteration answers the goal: no observer has moved the run yet
    assert calls["a4"]["observer"] == observer and results["a4"]["observer"] == observer
    assert calls["a4"]["run_left"] is not None and results["a4"]["run_left"] == calls["a4"]["run_left"]
    observations = [e["payload"] for e in events if e["type"] == "observation.recorded"]
    assert len(observations) == 2 and all(o["planner"] == planner and o["observer"] == observer for o in observations)
    # Stored: the same events, less the hints.
    hints = {"planner", "observer", "run_left"}
    hinted = {e["event_id"]: e for e in events if e["type"] in ("tool.requested", "tool.completed",
                                                                 "observation.recorded")}
    kept = {e["event_id"]: e for e in stored if e["event_id"] in hinted}
    assert kept.keys() == hinted.keys()
    for event_id, event in kept.items():
        assert hints.isdisjoint(event["payload"]), event
        sent = hinted[event_id]
        assert event == {**sent, "payload": {k: v for k, v in sent["payload"].items() if k not in hints}}


@pytest.mark.parametrize("length", [200, 234])
def test_a_long_namespace_and_hostname_still_start_the_worker(length: int, distributed_env: dict[str, str]) -> None:
    """A queue's name is at most 255 bytes (AMQP's short string). A process's own queue is named after the namespace,
    the role and its hostname, which an operator chooses (``--hostname``): cut to fit. 234 is the longest namespace
    Celery's own names fit (``reply.<ns>.control.pidbox``): its planner's own queue has room for no hostname at all."""
    from types import SimpleNamespace

    from agentfleet.roles.runtime import close_runtime, runtime_for
    from agentfleet.workers.bootsteps import DeclareTopology

    namespace = "n" * (length - 6) + uuid.uuid4().hex[:6]
    settings = get_settings().model_copy(update={"namespace": namespace})
    app = create_app(settings)
    rt = runtime_for(app)
    worker = SimpleNamespace(hostname="planner.1@" + "é" * 150, app=app)  # Celery's worker: what the step reads
    try:
        app.amqp.queues.select([rt.topology.role_queues[C.PLANNER].name])
        with app.connection_for_write() as conn:
            rt.topology.declare(conn)
            DeclareTopology._own_queue(worker, rt, conn, C.PLANNER)
        own = rt.topology.own_queue(C.PLANNER, rt.tokens[C.PLANNER])
        assert len(own.name.encode()) <= 255 and own.name in app.amqp.queues.consume_from
        assert waiting(own.name) == 0  # declared on the broker
        ObservationRecorded(agent="a", iteration=0, observations=[], planner=rt.tokens[C.PLANNER])  # a valid token
    finally:
        with Connection(BROKER_URL) as conn:
            for token in rt.tokens.values():
                rt.topology.own_queue(C.PLANNER, token).bind(conn.default_channel).delete()
            rt.topology.delete(conn)
        close_runtime(app)
    # A namespace longer still has no room for a token: no affinity (the worker could not start anyway: Celery's own
    # names would not fit either).
    assert Topology("n" * 240).own_token(C.PLANNER, "planner.1@host") is None


def test_a_token_longer_than_a_queue_name_allows_is_refused_with_the_event() -> None:
    """An event naming a token no queue could have (a forged or broken one) fails validation: it is dead-lettered
    with its reason, as any malformed event (``decode``), not published into the broker's refusal."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ToolFinished(agent="a", iteration=1, call_id="c", tool="t", sibling_call_ids=["c"], result=ToolResult(ok=True),
                     observer="x" * 201)
