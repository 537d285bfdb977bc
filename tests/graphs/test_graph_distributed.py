"""Graphs on the real fleet (RabbitMQ, Postgres, Redis, a worker process per role): a goal from a plain AMQP
client answered on reply_to; each step seen on <ns>.public as plain JSON by a pika consumer, in order; fifty
branches over two executors joined once; `graph replay --from` forking a run on the fleet. Kills mid-node:
tests/workers/test_chaos_run.py (chaos_graph)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from agentfleet.events.contracts import GraphStepNotice
from agentfleet.loop.keys import run_id_for
from agentfleet.store import Store
from tests.conftest import ROOT, TEST_AGENTS, WorkerProcs
from tests.fleet.test_health_gate_fleet import start_fleet
from tests.helpers import AmqpClient

pytestmark = pytest.mark.integration
MESSY = "def f():\n\treturn 1   \nx = 2"


def test_a_graph_goal_from_any_amqp_client_is_answered_each_step_is_public_and_a_run_forks(
        workers: WorkerProcs, namespace: str, store: Store) -> None:
    workers.env["AGENTFLEET_AGENTS"] = f"{TEST_AGENTS},agentfleet.examples.tidy,tests.graphs.wide"
    start_fleet(workers, executors=2)
    client = AmqpClient()
    public = client.subscribe_public(namespace, "graph.step")
    tidy = client.publish_goal(namespace, "goal.tidy", {"agent": "tidy", "goal_id": "g-tidy",
                                                        "input": {"source": MESSY}})
    wide = client.publish_goal(namespace, "goal.wide", {"agent": "wide", "goal_id": "g-wide", "input": {"n": 50}})
    replies = client.replies(2, timeout=120)
    assert replies[tidy]["status"] == "succeeded", replies[tidy]
    assert replies[tidy]["output"]["report"] == "3 lines, 7 words; 2 fix(es): line 2, final newline"
    assert replies[wide]["status"] == "succeeded" and replies[wide]["output"]["total"] == sum(i * i for i in range(50))
    wide_run = run_id_for("wide", "g-wide")
    squares = [s for s in store.steps(wide_run) if s["name"] == "node_square"]
    assert len(squares) == 50 and len({s["worker"] for s in squares}) == 2  # spread over both executors
    assert [s["name"] for s in store.steps(wide_run) if s["kind"] == "tool"].count("node_add") == 1

    notices = [json.loads(body) for _props, body in client.drain(public, 6 + 4, timeout=20)]
    schema = GraphStepNotice.model_json_schema()
    for notice in notices:
        jsonschema.validate(notice, schema)
    steps = [(n["step"], n["nodes"]) for n in notices if n["graph"] == "tidy"]
    assert steps == [(0, ["lint"]), (1, ["fix"]), (2, ["lint"]), (3, ["count_lines", "count_words"]),
                     (4, ["report"]), (5, [])]
    chose = next(n for n in notices if n["graph"] == "tidy" and n["step"] == 1)["edges"]
    assert {"from": "lint", "to": "fix", "took": True, "because": "problems"} in chose
    assert [(n["step"], len(n["nodes"])) for n in notices if n["graph"] == "wide"] == [(0, 1), (1, 50), (2, 1),
                                                                                        (3, 0)]
    client.close()

    # The tidy run forked from its second lint with the text edited: a new run from that node, on the fleet.
    env = {**os.environ, **workers.env, "COLUMNS": "300"}
    forked = subprocess.run([sys.executable, "-m", "agentfleet.cli", "graph", "replay", run_id_for("tidy", "g-tidy"),
                             "--from", "lint", "--step", "2", "--edit", json.dumps({"source": "x \n"}), "--wait",
                             "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=180)
    assert forked.returncode == 0, forked.stderr[-2000:]
    result = json.loads(forked.stdout.strip().splitlines()[-1])
    assert result["status"] == "succeeded" and result["goal_id"].startswith("fork-")
    assert result["output"]["source"] == "x\n" and result["output"]["fixes"] == ["line 2", "final newline", "line 1"]

