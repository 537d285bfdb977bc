"""The distributed fleet: real `agentfleet worker` processes over RabbitMQ, checkpointed in Postgres."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient

pytestmark = pytest.mark.integration


@pytest.fixture
def amqp() -> Iterator[AmqpClient]:
    client = AmqpClient()
    yield client
    client.close()


@pytest.fixture
def fleet(workers: WorkerProcs, tmp_path: Path) -> WorkerProcs:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "app.py").write_text("import os\n" * 12)
    (tmp_path / "proj" / "notes.txt").write_text("a\nb\n")
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    return workers


def test_a_goal_from_any_amqp_client_runs_through_three_worker_processes(
    fleet: WorkerProcs, amqp: AmqpClient, namespace: str, store: Store
) -> None:
    corr = amqp.publish_goal(namespace, "goal.repo_report",
                             {"agent": "repo_report", "input": {"path": "proj"}, "goal_id": "e2e-1"})
    replies = amqp.replies(1, timeout=60)
    assert corr in replies, fleet.logs()
    result = replies[corr]
    assert result["status"] == "succeeded", result
    assert result["output"]["total_lines"] == 14 and result["output"]["files"] == 2
    assert result["output"]["largest_file"] == {"path": "proj/app.py", "lines": 12}
    steps = store.steps(result["run_id"])
    tools = [s for s in steps if s["kind"] == "tool"]
    assert [s["kind"] for s in steps].count("plan") == 3
    assert sorted(s["name"] for s in tools) == ["count_lines", "list_files", "read_file"]
    assert all(s["status"] == "succeeded" and s["attempts"] == 1 for s in steps)  # each ran exactly once
    assert len({s["idempotency_key"] for s in steps}) == len(steps)
    assert {s["worker"].split(".")[0] for s in steps} == {"planner", "executor"}


def test_each_side_effect_happens_exactly_once(fleet: WorkerProcs, amqp: AmqpClient, namespace: str,
                                               store: Store, tmp_path: Path) -> None:
    corr = amqp.publish_goal(namespace, "goal.ledger", {"agent": "ledger", "input": {}})
    result = amqp.replies(1)[corr]
    assert result["status"] == "succeeded", result
    lines = (tmp_path / f"ledger-{result['run_id']}.txt").read_text().splitlines()
    assert sorted(line.split(":")[1] for line in lines) == ["four", "one", "three", "two"]
    keys = [line.split(":")[2] for line in lines]
    stored = {s["idempotency_key"] for s in store.steps(result["run_id"]) if s["name"] == "append_ledger"}
    assert set(keys) == stored  # the tool saw the checkpoint's key, for outside systems to dedupe on


def test_the_same_goal_id_twice_is_one_run_and_both_copies_get_its_result(
    fleet: WorkerProcs, amqp: AmqpClient, namespace: str, store: Store, tmp_path: Path
) -> None:
    goal = {"agent": "ledger", "input": {}, "goal_id": f"dup-{uuid.uuid4().hex}"}
    first = amqp.publish_goal(namespace, "goal.ledger", goal)
    replies = amqp.replies(1)
    second = amqp.publish_goal(namespace, "goal.ledger", goal)  # after the run ended
    replies.update(amqp.replies(1))
    assert set(replies) == {first, second}
    assert replies[first]["run_id"] == replies[second]["run_id"]
    assert replies[first]["output"] == replies[second]["output"]
    run_id = replies[first]["run_id"]
    assert len((tmp_path / f"ledger-{run_id}.txt").read_text().splitlines()) == 4


def test_two_executor_processes_both_take_tool_calls(workers: WorkerProcs, amqp: AmqpClient, namespace: str,
                                                     store: Store) -> None:
    for role in (C.PLANNER, C.EXECUTOR, C.EXECUTOR, C.OBSERVER):
        workers.start(role, *(["--concurrency", "2"] if role == C.EXECUTOR else []))
    workers.wait_ready()
    corr = amqp.publish_goal(namespace, "goal.fanout", {"agent": "fanout", "input": {}})
    result = amqp.replies(1)[corr]
    assert result["status"] == "succeeded", result
    tool_workers = {s["worker"] for s in store.steps(result["run_id"]) if s["kind"] == "tool"}
    assert tool_workers == {workers.name(C.EXECUTOR, 1), workers.name(C.EXECUTOR, 2)}
    pids = {seen["output"]["pid"] for seen in result["output"]["seen"]}
    assert len(pids) == 2


def test_malformed_goals_are_rejected_and_kept_in_the_dead_letter_queue(
    workers: WorkerProcs, amqp: AmqpClient, namespace: str
) -> None:
    workers.start(C.PLANNER)
    workers.wait_ready()
    cases = {
        amqp.publish_goal(namespace, "goal.repo_report", b"{this is not json"): ErrorCode.MALFORMED_MESSAGE,
        amqp.publish_goal(namespace, "goal.nobody", {"agent": "nobody", "input": {}}): ErrorCode.UNKNOWN_AGENT,
        amqp.publish_goal(namespace, "goal.repo_report",
                          {"agent": "repo_report", "input": {"path": 7}}): ErrorCode.INPUT_INVALID,
        amqp.publish_goal(namespace, "goal.repo_report", b'["a", "list"]'): ErrorCode.MALFORMED_MESSAGE,
    }
    replies = amqp.replies(len(cases))
    assert {corr: r["error_code"] for corr, r in replies.items()} == cases
    assert all(r["status"] == "rejected" and r["message"] for r in replies.values())
    dead = amqp.drain(f"{namespace}.dead", len(cases))
    by_corr = {props.correlation_id: (props.headers, body) for props, body in dead}
    assert set(by_corr) == set(cases)
    for corr, code in cases.items():
        headers, _ = by_corr[corr]
        assert headers[C.HEADER_DEAD_ERROR_CODE] == code and headers[C.HEADER_DEAD_REASON]
    assert by_corr[next(iter(cases))][1] == b"{this is not json"  # the original body, untouched


def test_broken_internal_messages_are_dead_lettered_not_dropped(
    workers: WorkerProcs, amqp: AmqpClient, namespace: str
) -> None:
    from kombu import Connection

    from agentfleet.config.settings import Settings
    from agentfleet.events.topology import Topology
    from agentfleet.workers.app import create_app

    workers.start(C.PLANNER)
    workers.wait_ready()
    app = create_app(Settings(broker_url=workers.env["AGENTFLEET_BROKER_URL"], namespace=namespace))
    topo = Topology(namespace)
    # A task message whose envelope is garbage, and one naming a task nobody registered.
    app.send_task("goal.submitted", kwargs={"envelope": {"nonsense": True}}, queue=topo.role_queues[C.PLANNER],
                  exchange=topo.events.name, routing_key="goal.submitted")
    with Connection(workers.env["AGENTFLEET_BROKER_URL"]) as conn:
        conn.default_channel.basic_publish(
            conn.default_channel.prepare_message(json.dumps([[], {}, {}]).encode(), content_type="application/json",
                                                 content_encoding="utf-8",
                                                 headers={"task": "no.such.event", "id": "x1", "lang": "py"}),
            exchange="", routing_key=f"{namespace}.planner")
    dead = amqp.drain(f"{namespace}.dead", 2, timeout=30)
    assert len(dead) == 2, workers.logs()
    reasons = sorted((props.headers or {}).get(C.HEADER_DEAD_ERROR_CODE) or "broker" for props, _ in dead)
    assert reasons == ["MALFORMED_EVENT", "broker"]
    rejected = next(props for props, _ in dead if C.HEADER_DEAD_ERROR_CODE not in (props.headers or {}))
    assert rejected.headers["x-death"][0]["reason"] == "rejected"


def test_the_cli_submits_follows_and_shows_a_run(fleet: WorkerProcs) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                              cwd=ROOT, env=fleet.env, timeout=120)

    submitted = cli("submit", "repo_report", "--input", '{"path": "proj"}', "--wait", "--json")
    assert submitted.returncode == 0, submitted.stderr
    result = json.loads(submitted.stdout)
    assert result["status"] == "succeeded" and result["output"]["files"] == 2
    status = cli("status", result["run_id"], "--json")
    assert status.returncode == 0, status.stderr
    described = json.loads(status.stdout)
    assert described["state"] == "SUCCEEDED" and len(described["steps"]) == 6
    assert cli("status", "no-such-run").returncode == 2
    queued = cli("submit", "repo_report", "--input", '{"path": "proj"}', "--json")
    assert queued.returncode == 0 and json.loads(queued.stdout)["run_id"]
    bad = cli("submit", "repo_report", "--input", '{"path": 3}', "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["error_code"] == "INPUT_INVALID"
    followed = cli("submit", "repo_report", "--input", '{"path": "proj"}', "--wait")  # progress while it waits
    assert followed.returncode == 0, followed.stderr
    assert "iteration 0: model → list_files(" in followed.stdout, followed.stdout  # told by the steps' notices
    assert "✓ list_files" in followed.stdout and "iteration 2: model → final answer" in followed.stdout
    assert "iteration 2: model → final answer" in followed.stdout and "✓ count_lines" in followed.stdout
    traced = cli("trace", result["run_id"])
    assert traced.returncode == 0 and "PLANNING → SUCCEEDED on observation.recorded" in traced.stdout, traced.stdout
    waited = cli("submit", "slow_side_effect", "--wait", "--timeout", "0.5", "--json")
    assert waited.returncode == 3 and json.loads(waited.stdout)["status"] == "running"
