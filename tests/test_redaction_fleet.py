"""A canary secret in settings, a goal's input, a tool's arguments and its output leaves no trace in a log
line, an audit row, a public message or what Flower is told (issue 13)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.store.repository import Store
from agentfleet.workers.app import create_app
from tests.conftest import BROKER_URL, WorkerProcs
from tests.helpers import AmqpClient, eventually

pytestmark = pytest.mark.integration

CANARY = "canary-7f3a9e21-s3cr3t"


def test_a_canary_secret_appears_in_no_log_audit_row_public_message_or_flower_event(
        workers: WorkerProcs, namespace: str, store: Store) -> None:
    workers.env["AGENTFLEET_REDACT_VALUES"] = CANARY
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    client = AmqpClient()
    public = client.channel.queue_declare(queue="", exclusive=True).method.queue
    client.channel.queue_bind(public, f"{namespace}.public", routing_key="#")

    app = create_app(Settings(broker_url=BROKER_URL, namespace=namespace))
    # Task events are off until someone watches: switched on as Flower does, and each worker has said so.
    assert len(app.control.enable_events(reply=True, timeout=10, limit=len(C.ROLES)) or []) == len(C.ROLES)
    events: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:  # what Flower is told: Celery's task events
        receiver = app.events.Receiver(conn, handlers={"*": events.append})
        watcher = threading.Thread(target=receiver.capture, kwargs={"limit": None, "timeout": None}, daemon=True)
        watcher.start()
        client.publish_goal(namespace, "goal.leaky", {"agent": "leaky", "input": {"secret": CANARY},
                                                          "progress": True})  # its steps told publicly too
        [reply] = client.replies(1, timeout=60).values()

        def settled() -> bool:  # every task received has been reported ended, however (a retry ends one too)
            kinds = [e.get("type") for e in events]
            ended = sum(kinds.count(k) for k in ("task-succeeded", "task-failed", "task-retried", "task-rejected",
                                                 "task-revoked"))
            return kinds.count("task-received") > 0 and ended >= kinds.count("task-received")

        eventually(settled, timeout=30, message="task events")
        receiver.should_stop = True
        watcher.join(timeout=10)
    assert reply["status"] == "succeeded", reply
    assert CANARY in json.dumps(reply)  # the submitter's own Result carries it: the data did flow

    notices = []
    while True:
        method, _, body = client.channel.basic_get(public, auto_ack=True)
        if method is None:
            break
        notices.append(body.decode())
    client.close()
    assert any('"run.completed"' in n for n in notices), notices
    assert any('"step.planned"' in n for n in notices) and any('"tool.finished"' in n for n in notices), notices
    assert not [n for n in notices if CANARY in n]

    assert [e for e in events if e.get("type") == "task-received"], "no task events seen"
    assert not [e for e in events if CANARY in json.dumps(e, default=str)]

    workers.stop()  # every log line written
    logged = "".join(p.read_text(errors="replace") for p in workers.logdir.glob("*.log"))
    assert "tool use_key raised RuntimeError" in logged  # the line whose traceback quoted it
    assert CANARY not in logged

    import subprocess  # what `agentfleet trace` shows people: the tool's error quoted the key
    import sys

    from tests.conftest import ROOT

    traced = subprocess.run([sys.executable, "-m", "agentfleet.cli", "trace", reply["run_id"]], env=workers.env,
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert traced.returncode == 0 and "use_key" in traced.stdout, traced.stderr[-2000:]
    assert CANARY not in traced.stdout + traced.stderr

    audit = store.audit_trail(reply["run_id"])
    assert audit and CANARY not in json.dumps(audit, default=str)
    tool_steps = [s for s in store.steps(reply["run_id"]) if s["kind"] == "tool"]
    assert any(CANARY in json.dumps(s["input"]) for s in tool_steps)  # kept where the fleet needs it
