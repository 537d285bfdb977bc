"""Live progress on the real fleet: a run whose goal asks for it tells its steps (and its children's) on
<ns>.public, in order, masked, each fitting the schema `agentfleet schema` prints; `agentfleet.Client` and
`agentfleet submit --wait` follow them instead of polling the database."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import pytest

from agentfleet import Client, Result
from agentfleet import constants as C
from agentfleet.config.settings import get_settings
from agentfleet.loop.keys import run_id_for
from agentfleet.store import Store
from tests.conftest import ROOT, WorkerProcs
from tests.helpers import AmqpClient

pytestmark = pytest.mark.integration

CANARY = "canary-progress-51c2e0-s3cr3t"


def drain(client: AmqpClient, queue: str) -> list[dict[str, Any]]:
    got = []
    while True:
        method, _, body = client.channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(json.loads(body))


def test_a_run_tree_tells_its_steps_in_order_and_clients_follow_them(workers: WorkerProcs, namespace: str,
                                                                     store: Store) -> None:
    workers.env["AGENTFLEET_REDACT_VALUES"] = CANARY
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    printed = subprocess.run([sys.executable, "-m", "agentfleet.cli", "schema"], capture_output=True, text=True,
                             cwd=ROOT, env=workers.env, timeout=60)
    schemas = json.loads(printed.stdout)
    client = AmqpClient()
    public = client.subscribe_public(namespace, "#")

    corr = client.publish_goal(namespace, "goal.asker", {"agent": "asker", "goal_id": "tree-1", "progress": True,
                                                          "input": {"queries": ["alpha"], "note": CANARY}})
    plain = client.publish_goal(namespace, "goal.asker", {"agent": "asker", "goal_id": "tree-2",
                                                           "input": {"queries": ["beta"]}})
    replies = client.replies(2, timeout=90)
    assert replies[corr]["status"] == replies[plain]["status"] == "succeeded"
    root = run_id_for("asker", "tree-1")
    heard = drain(client, public)
    assert not [n for n in heard if CANARY in json.dumps(n)]
    trace = next(n["trace_id"] for n in heard if n.get("run_id") == root)
    tree = [n for n in heard if n.get("trace_id") == trace]
    steps = [n for n in tree if n["type"] in ("step.planned", "tool.started", "tool.finished", "run.waiting")]
    for notice in steps:
        jsonschema.validate(notice, schemas[notice["type"]])
    child = next(n["run_id"] for n in tree if n["run_id"] != root)

    def at(run: str, kind: str, **match: Any) -> int:
        return next(i for i, n in enumerate(tree) if n["run_id"] == run and n["type"] == kind
                    and all(n.get(k) == v for k, v in match.items()))

    first = at(root, "step.planned", iteration=0)
    assert {c["name"] for c in tree[first]["calls"]} == {"delegate", "slow_echo"}
    assert first < at(root, "tool.started", tool="slow_echo") < at(root, "tool.finished", tool="slow_echo")
    assert first < at(child, "step.planned", iteration=0) < at(child, "run.completed")
    assert at(child, "run.completed") < at(root, "step.planned", iteration=1) < at(root, "run.completed")
    assert tree[at(root, "tool.finished", tool="slow_echo")]["ok"] is True
    assert tree[at(root, "step.planned", iteration=1)]["calls"][0]["name"] == "final_answer"
    other = run_id_for("asker", "tree-2")  # no progress asked: its end only
    assert {n["type"] for n in heard if n.get("run_id") == other} == {"run.completed"}
    client.close()

    with Client(get_settings()) as fleet:
        items = list(fleet.stream("flaky_caller", {"n": 7}, timeout_s=90))
        assert isinstance(items[-1], Result) and items[-1].status == "succeeded"
        kinds = [i["type"] for i in items[:-1]]
        assert kinds[:4] == ["step.planned", "tool.started", "tool.finished", "step.planned"], kinds
        assert kinds[-1] == "run.completed"
        run_id = fleet.submit("flaky_caller", {"n": 8})
        waited = fleet.wait(run_id, timeout_s=60)
        assert waited is not None and waited.run_id == run_id and waited.output == {"done": True, "seen": [
            {"ok": True, "output": {"n": 8}}]}
        assert fleet.wait(run_id, timeout_s=1) == waited  # ended before this looked: from its checkpoint

    shown = subprocess.run([sys.executable, "-m", "agentfleet.cli", "submit", "flaky_caller", "--input",
                            '{"n": 9}', "--wait"], capture_output=True, text=True, cwd=ROOT, env=workers.env,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "iteration 0: model → flaky(" in shown.stdout and "✓ flaky" in shown.stdout, shown.stdout
    assert "iteration 1: model → final answer" in shown.stdout
