"""Domain events on the real fleet: an outside system publishes plain JSON to the inbox; the fleet records it,
mirrors it on <ns>.public for any AMQP client, and starts one run per (event, agent)."""

from __future__ import annotations

import json
import time

import pika
import pytest

from agentfleet.events.domain import event_id_for, trigger_goal_id
from agentfleet.loop.keys import run_id_for
from agentfleet.loop.states import RunState
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.fleet.test_health_gate_fleet import start_fleet
from tests.helpers import AmqpClient, eventually
from tests.ops.test_dead_letters import dlq

pytestmark = pytest.mark.integration


def publish_event(client: AmqpClient, namespace: str, name: str, payload: dict, message_id: str) -> None:
    client.channel.basic_publish(exchange=f"{namespace}.inbox", routing_key=f"domain.{name}",
                                 body=json.dumps(payload).encode(),
                                 properties=pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                                                 message_id=message_id))


def test_an_outside_event_sent_twice_triggers_one_run_and_is_mirrored_plainly(workers: WorkerProcs, namespace: str,
                                                                            store: Store) -> None:
    start_fleet(workers)
    client = AmqpClient()
    public = client.subscribe_public(namespace, "domain.#")
    payload = {"ticket": "EXT-7", "priority": "high"}
    for _ in range(2):
        publish_event(client, namespace, "case.triaged", payload, message_id="crm-event-7")
    event_id = event_id_for("external", "case.triaged", "crm-event-7")
    run_id = run_id_for("on_triage", trigger_goal_id(event_id, "on_triage"))
    run = eventually(lambda: (r := store.get_run(run_id)) and r.state == RunState.SUCCEEDED and r, timeout=60)
    assert run.input == payload and run.cause["source"] == "external"
    [(_props, body)] = client.drain(public, 1, timeout=20)  # bound to domain.#: it came as domain.<name>
    mirrored = json.loads(body)
    assert mirrored["type"] == "domain.case.triaged" and mirrored["payload"] == payload
    assert mirrored["event_id"] == event_id and mirrored["source"] == "external"
    time.sleep(1.0)
    assert len([e for e in store.domain_events(name="case.triaged") if e["event_id"] == event_id]) == 1
    assert [r for r in store.list_runs(agent="on_triage", limit=500) if r.input == payload] == [run]


def test_an_outside_event_breaking_its_schema_is_dead_lettered_with_the_reason(workers: WorkerProcs,
                                                                               namespace: str) -> None:
    start_fleet(workers)
    client = AmqpClient()
    publish_event(client, namespace, "case.triaged", {"ticket": "EXT-8", "priority": "whenever"}, "crm-8")
    letters = eventually(lambda: dlq(workers, "list"), timeout=30)
    assert letters[0]["error_code"] == "INPUT_INVALID" and "priority" in letters[0]["reason"]
    assert letters[0]["original_routing_key"] == "domain.case.triaged"


def test_the_support_chain_is_seen_by_a_plain_pika_consumer_in_causal_order(workers: WorkerProcs, namespace: str,
                                                                           store: Store) -> None:
    from tests.conftest import TEST_AGENTS

    workers.env["AGENTFLEET_AGENTS"] = f"{TEST_AGENTS},agentfleet.examples.support"
    start_fleet(workers)
    client = AmqpClient()
    public = client.subscribe_public(namespace, "#")  # a dashboard's view: plain JSON, no agentfleet code
    client.publish_goal(namespace, "goal.triage", {"agent": "triage", "input": {
        "ticket_id": "T-9", "text": "I was charged twice, please refund"}})
    seen: list[dict] = []
    deadline = time.monotonic() + 90
    while sum(1 for m in seen if m["type"] == "run.completed") < 4 and time.monotonic() < deadline:
        seen += [json.loads(body) for _props, body in client.drain(public, 1, timeout=1)]
    kinds = [(m["type"], m.get("agent") or m.get("payload", {}).get("ticket_id")) for m in seen]
    ends = [m for m in seen if m["type"] == "run.completed"]
    assert sorted(m["agent"] for m in ends) == ["kb_search", "kb_search", "resolver", "triage"], kinds
    assert all(m["status"] == "succeeded" for m in ends)
    at = {(m["type"], m.get("agent"), m.get("run_id")): i for i, m in enumerate(seen)}
    triaged = next(i for i, m in enumerate(seen) if m["type"] == "domain.ticket.triaged")
    resolver_end = next(i for k, i in at.items() if k[0] == "run.completed" and k[1] == "resolver")
    lookups = [i for k, i in at.items() if k[0] == "run.completed" and k[1] == "kb_search"]
    assert triaged < resolver_end and all(i < resolver_end for i in lookups)  # a cause before its effects
    assert seen[triaged]["payload"]["topic"] == "billing" and seen[triaged]["source"] == "run"
    # Enough to draw the tree without agentfleet's code: every end names its trace, and a delegated run its
    # parent's run and call.
    [resolver] = [m for m in ends if m["agent"] == "resolver"]
    assert {m["trace_id"] for m in ends} == {seen[triaged]["trace_id"]}
    assert sorted((m.get("parent_run_id"), m.get("parent_call_id")) for m in ends if m["agent"] == "kb_search") == [
        (resolver["run_id"], "ask0"), (resolver["run_id"], "ask1")]
    assert all(m["parent_run_id"] is None for m in ends if m["agent"] != "kb_search")


def test_agentfleet_publish_sends_an_outside_event_to_the_fleet(workers: WorkerProcs, store: Store) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    start_fleet(workers)
    payload = {"ticket": "CLI-1", "priority": "low"}
    sent = subprocess.run([sys.executable, "-m", "agentfleet.cli", "publish", "case.triaged", "--payload",
                           json.dumps(payload), "--id", "cli-event-1", "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=workers.env, timeout=60)
    assert sent.returncode == 0, sent.stderr
    event_id = json.loads(sent.stdout)["event_id"]
    assert event_id == event_id_for("external", "case.triaged", "cli-event-1")  # as the inbox derives it
    run_id = run_id_for("on_triage", trigger_goal_id(event_id, "on_triage"))
    run = eventually(lambda: (r := store.get_run(run_id)) and r.state == RunState.SUCCEEDED and r, timeout=60)
    assert run.input == payload and run.cause["source"] == "external"
