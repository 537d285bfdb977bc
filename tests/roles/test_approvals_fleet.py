"""Approvals on the real fleet: RabbitMQ, Postgres, worker processes; answers as plain AMQP messages.

What a tool did is counted in its ledger file; what dashboards see is read off
``<ns>.public`` with a plain pika consumer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from agentfleet.loop.states import RunState
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.fleet.test_health_gate_fleet import lines, start_fleet, submit
from tests.helpers import AmqpClient, eventually

pytestmark = pytest.mark.integration


def answer(client: AmqpClient, namespace: str, body: dict[str, Any] | bytes, **properties: Any) -> str:
    return client.publish_goal(namespace, C.APPROVAL_RESOLVE_ROUTING_KEY, body, **properties)


def notices(client: AmqpClient, queue: str, expected: int) -> list[dict[str, Any]]:
    got = [json.loads(body) for _props, body in client.drain(queue, expected, timeout=30)]
    assert len(got) == expected, got
    return got


def waiting(store: Store, run_id: str) -> None:
    eventually(lambda: (run := store.get_run(run_id)) is not None and run.state == RunState.WAITING_APPROVAL,
               timeout=60, message=f"run {run_id} waits for approval")


def pays(calls: list[list[Any]]) -> dict[str, Any]:
    return {"calls": calls}


def test_an_approval_survives_a_restart_of_every_worker_and_a_duplicated_answer_runs_the_call_once(
        workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path) -> None:
    client = AmqpClient()
    public = client.subscribe_public(namespace, "approval.*")
    start_fleet(workers)
    corr, run_id = submit(client, namespace, "payer",
                          pays([["p", "pay", {"payee": "acme", "amount": 7, "token": "s3cret"}]]))
    waiting(store, run_id)
    for name, _proc in list(workers.procs):
        workers.kill(name)
    assert store.get_run(run_id).state == RunState.WAITING_APPROVAL  # type: ignore[union-attr]
    start_fleet(workers)

    approve = {"run_id": run_id, "call_id": "p", "decision": "approve", "note": "known vendor"}
    first = answer(client, namespace, approve, user_id="guest")  # the broker checks user_id
    second = answer(client, namespace, approve, user_id="guest")  # a client retrying
    replies = client.replies(3, timeout=60)
    assert replies[first]["status"] == "accepted" and replies[first]["by"] == "guest", replies[first]
    assert replies[second]["status"] == "rejected", replies[second]
    assert replies[second]["error_code"] == ErrorCode.APPROVAL_NOT_PENDING
    assert "already approved by guest" in replies[second]["message"]
    result = replies[corr]
    assert result["status"] == "succeeded", result
    assert result["output"]["seen"] == [{"ok": True, "output": {"paid": "acme", "amount": 7},
                                         "approval": {"by": "guest", "note": "known vendor"}}]
    assert [line.split(":")[:3] for line in lines(tmp_path / f"ledger-{run_id}.txt")] == [["pay", "acme", "7"]]

    requested, resolved = notices(client, public, 2)
    assert requested["type"] == "approval.requested" and requested["run_id"] == run_id
    assert requested["arguments"] == {"payee": "acme", "amount": 7, "token": "***"}
    assert requested["rule"] == "pay.requires_approval"
    assert resolved["type"] == "approval.resolved" and resolved["decision"] == "approved"
    assert (resolved["by"], resolved["note"], resolved["edited"]) == ("guest", "known vendor", False)
    [history] = store.approvals_of(run_id)
    assert (history.status, history.resolved_by) == ("approved", "guest")


def test_denials_expiry_and_refused_answers_over_the_inbox(
        workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path) -> None:
    client = AmqpClient()
    public = client.subscribe_public(namespace, "approval.*")
    workers.env["AGENTFLEET_APPROVAL_POLL_S"] = "0.2"
    start_fleet(workers)
    denied_corr, denied_run = submit(client, namespace, "payer", pays([["p", "pay", {"payee": "eve", "amount": 9}]]))
    waiting(store, denied_run)

    base = {"run_id": denied_run, "call_id": "p"}
    bad_edit = answer(client, namespace, {**base, "decision": "approve", "arguments": {"payee": "eve",
                                                                                      "amount": "lots"}},
                      user_id="guest")
    unknown = answer(client, namespace, {**base, "call_id": "nope", "decision": "approve"}, user_id="guest")
    malformed = answer(client, namespace, b'{"run_id": ')
    refused = client.replies(3, timeout=60)
    assert refused[bad_edit]["error_code"] == ErrorCode.INVALID_ARGUMENTS, refused[bad_edit]
    assert "amount" in refused[bad_edit]["message"] and "stays pending" in refused[bad_edit]["message"]
    assert refused[unknown]["error_code"] == ErrorCode.UNKNOWN_APPROVAL
    assert refused[malformed]["error_code"] == ErrorCode.MALFORMED_MESSAGE
    assert all(r["status"] == "rejected" and r["type"] == "approval.answer" for r in refused.values())
    assert [a.call_id for a in store.pending_approvals(run_id=denied_run)] == ["p"]  # still waiting

    # Containment 13: the body's "by" is whatever the sender writes; the broker vouches for user_id.
    unvouched = answer(client, namespace, {**base, "decision": "approve", "by": "the-cfo"})
    assert client.replies(1, timeout=60)[unvouched]["error_code"] == ErrorCode.PERMISSION_DENIED
    assert [a.call_id for a in store.pending_approvals(run_id=denied_run)] == ["p"]  # still waiting
    deny = answer(client, namespace, {**base, "decision": "deny", "note": "not this vendor", "by": "carol"},
                  user_id="guest")
    expiring_corr, expiring_run = submit(client, namespace, "payer",
                                         pays([["s", "pay_soon", {"payee": "acme", "amount": 1}]]))
    replies = client.replies(3, timeout=60)
    assert replies[deny]["status"] == "accepted" and replies[deny]["by"] == "guest (as carol)"
    [seen] = replies[denied_corr]["output"]["seen"]
    assert seen["error_code"] == ErrorCode.APPROVAL_DENIED
    assert "guest (as carol) denied pay: not this vendor" in seen["message"]
    [seen] = replies[expiring_corr]["output"]["seen"]
    assert seen["error_code"] == ErrorCode.APPROVAL_EXPIRED
    assert lines(tmp_path / f"ledger-{denied_run}.txt") == lines(tmp_path / f"ledger-{expiring_run}.txt") == []

    by_run: dict[str, list[dict[str, Any]]] = {}
    for n in notices(client, public, 4):
        by_run.setdefault(n["run_id"], []).append(n)
    assert [(n["type"], n.get("decision"), n.get("by")) for n in by_run[denied_run]] == [
        ("approval.requested", None, None), ("approval.resolved", "denied", "guest (as carol)")]
    assert [(n["type"], n.get("decision")) for n in by_run[expiring_run]] == [
        ("approval.requested", None), ("approval.resolved", "expired")]
    dead = client.drain(f"{namespace}.{C.DEAD}", 3, timeout=10)  # every refused answer is kept with its reason
    assert sorted(props.headers[C.HEADER_DEAD_ERROR_CODE] for props, _body in dead) == sorted(
        [ErrorCode.INVALID_ARGUMENTS, ErrorCode.UNKNOWN_APPROVAL, ErrorCode.MALFORMED_MESSAGE])
