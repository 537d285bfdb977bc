"""A catalogue of hostile inbox messages: each is answered or dead-lettered with a reason, and no worker exits."""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, eventually

pytestmark = pytest.mark.integration

GOOD = {"agent": "repo_report", "input": {"path": "."}}
MAX_BYTES = 64 * 1024
E = ErrorCode
R = C.APPROVAL_RESOLVE_ROUTING_KEY
ANSWER = {"run_id": "no-such-run", "call_id": "c", "decision": "approve"}


def _deep(levels: int) -> bytes:
    return b'{"agent": "repo_report", "input": {"path": ".", "x": ' + b"[" * levels + b"]" * levels + b"}}"


# (name, routing key, body, extra properties, expected code)
CATALOGUE: list[tuple[str, str, bytes, dict[str, Any], ErrorCode]] = [
    ("not json", "goal.repo_report", b"\xff\xfe{", {}, E.MALFORMED_MESSAGE),
    ("empty body", "goal.repo_report", b"", {}, E.MALFORMED_MESSAGE),
    ("json null", "goal.repo_report", b"null", {}, E.MALFORMED_MESSAGE),
    ("json array", "goal.repo_report", b"[1, 2]", {}, E.MALFORMED_MESSAGE),
    ("unknown compression", "goal.repo_report", b"xx", {"headers": {"compression": "application/x-made-up"}},
     E.MALFORMED_MESSAGE),
    ("corrupt zlib", "goal.repo_report", b"not zlib", {"headers": {"compression": "application/x-gzip"}},
     E.MALFORMED_MESSAGE),
    ("zlib bomb", "goal.repo_report", zlib.compress(b" " * (300 * 1024 * 1024), 9),
     {"headers": {"compression": "application/x-gzip"}}, E.MESSAGE_TOO_LARGE),
    ("oversized body", "goal.repo_report",
     json.dumps({**GOOD, "input": {"path": ".", "pad": "x" * (2 * MAX_BYTES)}}).encode(), {}, E.MESSAGE_TOO_LARGE),
    ("NUL in goal_id", "goal.repo_report", json.dumps({**GOOD, "goal_id": "a\u0000b"}).encode(), {},
     E.MALFORMED_MESSAGE),
    ("goal_id posing as a delegation's child", "goal.repo_report",
     json.dumps({**GOOD, "goal_id": "delegation/a-run/a-call"}).encode(), {}, E.MALFORMED_MESSAGE),
    ("lone surrogate", "goal.repo_report", b'{"agent": "repo_report", "input": {"path": "\\ud800"}}', {},
     E.MALFORMED_MESSAGE),
    ("max_steps over the internal maximum", "goal.repo_report",
     json.dumps({**GOOD, "limits": {"max_steps": 20000}}).encode(), {}, E.MALFORMED_MESSAGE),
    ("deadline Infinity", "goal.repo_report", b'{"agent": "repo_report", "input": {"path": "."}, '
     b'"limits": {"deadline_s": Infinity}}', {}, E.MALFORMED_MESSAGE),
    ("number beyond a float", "goal.repo_report", b'{"agent": "repo_report", "input": {"path": "."}, '
     b'"limits": {"max_cost_usd": 1e400}}', {}, E.MALFORMED_MESSAGE),
    ("zero budget", "goal.repo_report", json.dumps({**GOOD, "limits": {"max_cost_usd": 0}}).encode(), {},
     E.MALFORMED_MESSAGE),
    ("nested 5000 deep", "goal.repo_report", _deep(5000), {}, E.MALFORMED_MESSAGE),
    ("nested past the depth limit", "goal.repo_report", _deep(100), {}, E.MALFORMED_MESSAGE),
    ("unknown content encoding", "goal.repo_report", json.dumps(GOOD).encode(),
     {"content_encoding": "no-such-codec"}, E.MALFORMED_MESSAGE),
    ("pickle content type", "goal.repo_report", b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00}\x94.",
     {"content_type": "application/x-python-serialize"}, E.MALFORMED_MESSAGE),
    ("spoofed and odd headers", "goal.nobody", json.dumps({"agent": "nobody", "input": {}}).encode(),
     {"headers": {"x-death": [{"reason": "client"}], C.HEADER_DEAD_REASON: "spoofed", "nested": {"a": {"b": 1}},
                  "big": "h" * 5000, "n": 7}}, E.UNKNOWN_AGENT),
    ("input breaks the schema", "goal.repo_report", json.dumps({"agent": "repo_report", "input": {"path": 3}})
     .encode(), {}, E.INPUT_INVALID),
    ("routing key with an extra word", "goal.repo_report.extra", json.dumps(GOOD).encode(), {}, E.UNROUTABLE),
    ("routing key in capitals", "GOAL.repo_report", json.dumps(GOOD).encode(), {}, E.UNROUTABLE),
    ("routing key for another agent", "goal.troubled", json.dumps(GOOD).encode(), {}, E.MALFORMED_MESSAGE),
    # Answers to approval requests share the inbox, its limits and its answers.
    ("answer not json", R, b"\xff{", {}, E.MALFORMED_MESSAGE),
    ("answer with an unknown decision", R, json.dumps({**ANSWER, "decision": "maybe"}).encode(), {},
     E.MALFORMED_MESSAGE),
    ("answer with a field of its own", R, json.dumps({**ANSWER, "approved": True}).encode(), {}, E.MALFORMED_MESSAGE),
    ("answer with a numeric run id", R, json.dumps({**ANSWER, "run_id": 5}).encode(), {}, E.MALFORMED_MESSAGE),
    ("answer with NUL in call_id", R, json.dumps({**ANSWER, "call_id": "c\u0000"}).encode(), {},
     E.MALFORMED_MESSAGE),
    ("answer note of 3000 characters", R, json.dumps({**ANSWER, "note": "n" * 3000}).encode(), {},
     E.MALFORMED_MESSAGE),
    ("answer arguments past the depth limit", R,
     b'{"run_id": "r", "call_id": "c", "decision": "approve", "arguments": {"x": ' + b"[" * 100 + b"]" * 100 + b"}}",
     {}, E.MALFORMED_MESSAGE),
    ("oversized answer", R, json.dumps({**ANSWER, "arguments": {"pad": "x" * (2 * MAX_BYTES)}}).encode(), {},
     E.MESSAGE_TOO_LARGE),
    ("answer to nothing", R, json.dumps(ANSWER).encode(), {"user_id": "guest"}, E.UNKNOWN_APPROVAL),
    ("answer no broker vouches for", R, json.dumps({**ANSWER, "by": "the-cfo"}).encode(), {}, E.PERMISSION_DENIED),
    # Domain events from outside share the inbox too: refused events are answered and dead-lettered alike.
    ("event not json", "domain.case.triaged", b"\xff{", {}, E.MALFORMED_MESSAGE),
    ("event that is an array", "domain.case.triaged", b"[1, 2]", {}, E.MALFORMED_MESSAGE),
    ("event past the depth limit", "domain.case.triaged", b'{"x": ' + b"[" * 100 + b"]" * 100 + b"}", {},
     E.MALFORMED_MESSAGE),
    ("oversized event", "domain.case.triaged", json.dumps({"pad": "x" * (2 * MAX_BYTES)}).encode(), {},
     E.MESSAGE_TOO_LARGE),
    ("event breaking its schema", "domain.case.triaged", json.dumps({"ticket": 1}).encode(), {}, E.INPUT_INVALID),
    ("event name in capitals", "domain.Case.Triaged", b"{}", {}, E.INPUT_INVALID),
    ("event with no name", "domain.", b"{}", {}, E.INPUT_INVALID),
    ("event name past its column", "domain." + "a" * 248, b"{}", {}, E.INPUT_INVALID),
]


@pytest.fixture
def fleet(workers: WorkerProcs) -> Iterator[WorkerProcs]:
    workers.env["AGENTFLEET_INBOX_MAX_BYTES"] = str(MAX_BYTES)
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    yield workers


def test_every_hostile_inbox_message_gets_a_coded_answer_and_a_reasoned_dead_letter(
    fleet: WorkerProcs, namespace: str
) -> None:
    client = AmqpClient()
    sent: dict[str, tuple[str, ErrorCode]] = {}
    for name, routing_key, body, extra, code in CATALOGUE:
        corr = uuid.uuid4().hex
        props = pika.BasicProperties(content_type=extra.get("content_type", "application/json"),
                                     content_encoding=extra.get("content_encoding"), headers=extra.get("headers"),
                                     user_id=extra.get("user_id"),
                                     reply_to=client.reply_queue, correlation_id=corr, delivery_mode=2)
        client.channel.basic_publish(exchange=f"{namespace}.inbox", routing_key=routing_key, body=body,
                                     properties=props)
        sent[corr] = (name, code)
    replies = client.replies(len(sent), timeout=90)
    answered = {sent[c][0]: r.get("error_code") for c, r in replies.items()}
    assert answered == {name: str(code) for name, code in sent.values()}, fleet.logs()[-3000:]
    assert all(r["status"] == "rejected" for r in replies.values())

    dead = client.drain(f"{namespace}.dead", len(CATALOGUE), timeout=30)
    assert len(dead) == len(CATALOGUE)
    by_corr = {props.correlation_id: props for props, _ in dead}
    for corr, (name, code) in sent.items():
        headers = by_corr[corr].headers
        assert headers[C.HEADER_DEAD_ERROR_CODE] == code, name
        assert headers[C.HEADER_DEAD_REASON] and headers[C.HEADER_DEAD_REASON] != "spoofed", name
        assert "x-death" not in headers, name
        assert by_corr[corr].message_id, name

    for proc_name, proc in fleet.procs:
        assert proc.poll() is None, f"{proc_name} exited"
    corr = client.publish_goal(namespace, "goal.repo_report", GOOD)
    after = client.replies(1, timeout=60).get(corr)
    client.close()
    assert after is not None and after["status"] == "succeeded", fleet.logs()[-3000:]


def test_an_undecodable_internal_message_is_dead_lettered_not_dropped(fleet: WorkerProcs, namespace: str) -> None:
    client = AmqpClient()
    client.channel.basic_publish(
        exchange=f"{namespace}.events", routing_key="tool.requested", body=b"garbage",
        properties=pika.BasicProperties(content_type="application/json", headers={"compression": "x-made-up"},
                                        delivery_mode=2))
    dead = client.drain(f"{namespace}.dead", 1, timeout=30)
    assert dead and dead[0][0].headers["x-death"][0]["reason"] == "rejected"
    assert all(p.poll() is None for _, p in fleet.procs)
    client.close()


def test_a_task_message_with_an_undecodable_body_is_dead_lettered_and_holds_no_worker_slot(
        fleet: WorkerProcs, namespace: str) -> None:
    """Headers of a real event task, a body no worker can read (or no envelope in it): each copy is dead-lettered, none
    stays unacked in a worker (with prefetch 1, a few such would stop a role taking anything), and goals still run.
    Whichever way a worker takes the message (``workers/strategy.py``)."""
    client = AmqpClient()
    copies = 6  # of each, more than a worker's threads
    bodies = [(b"garbage", "utf-8"), (b"\xff\xfe[", "utf-8"), (b'[[], {"envelope": {}}, {}]', "x-made-up")]
    for b, (body, content_encoding) in enumerate(bodies):
        for i in range(copies):
            client.channel.basic_publish(
                exchange=f"{namespace}.events", routing_key="tool.requested", body=body,
                properties=pika.BasicProperties(content_type="application/json", content_encoding=content_encoding,
                                                delivery_mode=2, headers={"task": "tool.requested",
                                                                          "id": f"bad-{b}-{i}", "lang": "py"}))
    dead = client.drain(f"{namespace}.dead", copies * len(bodies), timeout=30)
    assert len(dead) == copies * len(bodies), fleet.logs()[-3000:]
    for props, _ in dead:  # rejected by the worker (the broker says why), or kept by the fleet with its reason
        assert (props.headers.get("x-death") or [{}])[0].get("reason") == "rejected" or props.headers.get(
            C.HEADER_DEAD_ERROR_CODE) == ErrorCode.MALFORMED_EVENT, props.headers
    rejected = sorted(body for props, body in dead if props.headers.get("x-death"))
    assert rejected == sorted([b"garbage", b"\xff\xfe["] * copies)  # kept as they came
    corr = client.publish_goal(namespace, "goal.repo_report", GOOD)
    after = client.replies(1, timeout=60).get(corr)
    client.close()
    assert after is not None and after["status"] == "succeeded", fleet.logs()[-3000:]
    assert all(p.poll() is None for _, p in fleet.procs)


def test_a_goal_id_reused_with_another_input_is_refused_with_its_own_code(
    fleet: WorkerProcs, namespace: str
) -> None:
    client = AmqpClient()
    goal_id = f"same-{uuid.uuid4().hex}"
    first = client.publish_goal(namespace, "goal.repo_report", {**GOOD, "goal_id": goal_id})
    assert client.replies(1, timeout=60)[first]["status"] == "succeeded"
    again = client.publish_goal(namespace, "goal.repo_report", {**GOOD, "goal_id": goal_id})
    other = client.publish_goal(namespace, "goal.repo_report", {**GOOD, "input": {"path": "x"}, "goal_id": goal_id})
    replies = client.replies(2, timeout=60)
    client.close()
    assert replies[again]["status"] == "succeeded"
    assert replies[other]["status"] == "rejected" and replies[other]["error_code"] == ErrorCode.GOAL_CONFLICT


def test_an_event_id_reused_with_another_payload_is_refused_with_its_own_code(
    fleet: WorkerProcs, namespace: str, store: Store
) -> None:
    """Containment 17: the same message_id with a different body was dropped silently."""
    client = AmqpClient()
    message_id = f"evt-{uuid.uuid4().hex}"

    def publish(payload: dict[str, str]) -> str:
        corr = uuid.uuid4().hex
        client.channel.basic_publish(
            exchange=f"{namespace}.inbox", routing_key="domain.case.triaged", body=json.dumps(payload).encode(),
            properties=pika.BasicProperties(content_type="application/json", message_id=message_id,
                                            reply_to=client.reply_queue, correlation_id=corr, delivery_mode=2))
        return corr

    from agentfleet.events.domain import external_event_id

    publish({"ticket": "T-1", "priority": "low"})
    event_id = external_event_id("case.triaged", message_id, b"")  # a message_id names the event, not its body
    eventually(lambda: store.domain_event(event_id), timeout=30, message="the first event is recorded")
    publish({"ticket": "T-1", "priority": "low"})  # the same event again: taken, one event
    other = publish({"ticket": "T-1", "priority": "high"})
    replies = client.replies(1, timeout=60)
    client.close()
    assert replies[other]["status"] == "rejected" and replies[other]["error_code"] == ErrorCode.EVENT_CONFLICT
