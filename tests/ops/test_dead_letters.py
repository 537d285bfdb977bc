"""agentfleet dlq: dead letters listed without being consumed, shown, replayed where they came from, purged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pika
import pytest

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from tests.conftest import ROOT, WorkerProcs
from tests.helpers import AmqpClient

pytestmark = pytest.mark.integration


def dlq(workers: WorkerProcs, *args: str, as_json: bool = True) -> Any:
    env = {**os.environ, **{k: v for k, v in workers.env.items() if k.startswith("AGENTFLEET_")},
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "agentfleet.cli", "dlq", *args, *(["--json"] if as_json else [])],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_dead_letters_are_listed_shown_replayed_and_purged(workers: WorkerProcs, namespace: str) -> None:
    workers.env["AGENTFLEET_AGENTS"] = "agentfleet.examples.repo_report"  # a planner that lacks 'single'
    old_planner = workers.start(C.PLANNER)
    workers.start(C.EXECUTOR)
    workers.start(C.OBSERVER)
    workers.wait_ready()
    client = AmqpClient()
    rejected = client.publish_goal(namespace, "goal.single", {"agent": "single", "input": {}})
    assert client.replies(1, timeout=30)[rejected]["error_code"] == ErrorCode.UNKNOWN_AGENT
    client.channel.basic_publish(  # undecodable: rejected by the executor's consumer, dead-lettered by the broker
        exchange=f"{namespace}.events", routing_key="tool.requested", body=b"zz",
        properties=pika.BasicProperties(headers={"compression": "x-made-up"}, delivery_mode=2))
    client.channel.basic_publish(  # a task message whose envelope is not one: kept as it came
        exchange=f"{namespace}.events", routing_key="tool.requested", body=json.dumps([[], {"envelope": {}}, {}]),
        properties=pika.BasicProperties(content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                                        headers={"task": "tool.requested", "id": "not-an-event", "lang": "py"}))
    deadline = time.monotonic() + 30
    while len(letters := dlq(workers, "list")) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert len(letters) == 3 and len(dlq(workers, "list")) == 3  # listing consumes nothing
    by_source = {letter["source"].split(":")[0]: letter for letter in letters}
    assert by_source["inbox"]["error_code"] == ErrorCode.UNKNOWN_AGENT
    assert by_source["inbox"]["original_routing_key"] == "goal.single"
    assert by_source["queue"]["reason"].startswith("rejected from queue") and by_source["queue"]["error_code"] is None
    assert by_source["task"]["error_code"] == ErrorCode.MALFORMED_EVENT
    assert [x["id"] for x in dlq(workers, "list", "--reason", "unknown_agent")] == [by_source["inbox"]["id"]]
    assert len(dlq(workers, "list", "--since", "1h")) == 3 and dlq(workers, "list", "--since", "2099-01-01") == []

    shown = dlq(workers, "show", by_source["inbox"]["id"], as_json=False)
    assert json.loads(shown["body_head"]) == {"agent": "single", "input": {}}
    assert shown["properties"]["reply_to"] == client.reply_queue
    assert shown["headers"][C.HEADER_DEAD_REASON].startswith("unknown agent 'single'")

    old_planner.terminate()  # the fix: a planner that knows the agent
    old_planner.wait()
    workers.env["AGENTFLEET_AGENTS"] = "agentfleet.examples.repo_report,tests.fixtures.agents"
    workers.start(C.PLANNER)
    workers.wait_ready()
    replayed = dlq(workers, "replay", by_source["inbox"]["id"])
    assert [r["outcome"] for r in replayed] == [f"replayed to {namespace}.inbox with routing key goal.single"]
    again = client.replies(1, timeout=60)[rejected]  # the same reply_to and correlation id, answered this time
    assert again["status"] == "succeeded", workers.logs()[-3000:]

    kept = dlq(workers, "replay", by_source["task"]["id"])
    assert kept[0]["outcome"].startswith("kept: not an event envelope")
    assert dlq(workers, "purge", "--matching", "--source", "queue:", "--yes")[0]["outcome"] == "purged"
    assert sorted(x["source"].split(":")[0] for x in dlq(workers, "list")) == ["task"]
    client.close()
