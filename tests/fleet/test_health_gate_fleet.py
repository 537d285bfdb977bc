"""Health-gated dispatch on the real fleet: RabbitMQ, Postgres, Redis and worker processes.

Switches are files in the workspace (every worker sees them); what ran is counted
in files the tools and checks append to.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentfleet import constants as C
from agentfleet.loop.keys import run_id_for
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, eventually

pytestmark = pytest.mark.integration


def start_fleet(workers: WorkerProcs, executors: int = 1) -> None:
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    for _ in range(executors):
        workers.start(C.EXECUTOR)
    workers.wait_ready()


def health(redis: Any, namespace: str, tool: str) -> dict[str, Any] | None:
    """A tool's health entry as the fleet wrote it (sealed under its key: ``fleet_seal``)."""
    key = f"{namespace}:health:{tool}"
    raw = redis.unseal(key, redis.client.get(key))
    return json.loads(raw) if raw else None


def submit(client: AmqpClient, namespace: str, agent: str, goal: dict[str, Any] | None = None) -> tuple[str, str]:
    goal_id = f"{agent}-{uuid.uuid4().hex}"
    corr = client.publish_goal(namespace, f"goal.{agent}", {"agent": agent, "input": goal or {}, "goal_id": goal_id})
    return corr, run_id_for(agent, goal_id)


def seen(result: dict[str, Any]) -> list[dict[str, Any]]:
    assert result["status"] == "succeeded", result
    return result["output"]["seen"]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def health_events(client: AmqpClient, queue: str, expected: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    return [json.loads(body) for _props, body in client.drain(queue, expected, timeout=timeout)]


def test_a_down_tool_is_not_offered_its_fallback_is_a_stale_call_is_refused_and_it_returns_when_healthy(
    workers: WorkerProcs, namespace: str, store: Store, fleet_redis: Any, fleet_seal: Any, tmp_path: Path
) -> None:
    client = AmqpClient()
    public = client.subscribe_public(namespace, "tool.health_changed")
    (tmp_path / "lookup-down").touch()
    start_fleet(workers)
    eventually(lambda: (health(fleet_seal, namespace, "primary_lookup") or {}).get("status") == "down",
               message="the check's failure reaches Redis")

    picky_corr, picky_run = submit(client, namespace, "picky")
    stale_corr, _ = submit(client, namespace, "stale")
    replies = client.replies(2, timeout=60)
    assert seen(replies[picky_corr]) == [{"ok": True, "output": {"key": "k1", "source": "backup"}}]
    offered = lines(tmp_path / f"offered-{picky_run}.txt")
    assert offered == ["backup_lookup final_answer"], offered
    plan = next(s for s in store.steps(picky_run) if s["kind"] == "plan" and s["iteration"] == 0)
    assert plan["input"]["tools"] == ["backup_lookup"]  # what the model saw is in the checkpoint
    assert "primary_lookup (its health check failed; use backup_lookup instead)" in plan["input"]["notice"]
    assert "lookup service refused" not in plan["input"]["notice"]  # the check's words: operators only
    (refused,) = seen(replies[stale_corr])
    assert refused["error_code"] == "TOOL_UNAVAILABLE" and refused["retryable"] is True
    assert "Use backup_lookup instead" in refused["hint"]
    assert not (tmp_path / "primary-body.txt").exists()  # the tool body was never entered

    (tmp_path / "lookup-down").unlink()
    eventually(lambda: (health(fleet_seal, namespace, "primary_lookup") or {}).get("status") == "healthy",
               message="the recovered check reaches Redis")
    again_corr, again_run = submit(client, namespace, "picky")
    assert seen(client.replies(1, timeout=60)[again_corr])[0]["output"]["source"] == "primary"
    assert lines(tmp_path / f"offered-{again_run}.txt") == ["primary_lookup final_answer"]
    assert lines(tmp_path / "primary-body.txt") == ["k1"]

    events = health_events(client, public, 3, timeout=5)
    client.close()
    assert [(e["tool"], e["kind"], e["status"]) for e in events] == [
        ("primary_lookup", "check", "down"), ("primary_lookup", "check", "healthy")]
    import jsonschema

    from agentfleet.events.contracts import ToolHealthNotice

    for event in events:  # what `agentfleet schema` promises other languages
        jsonschema.validate(event, ToolHealthNotice.model_json_schema())
    stored = store.health_changes("primary_lookup")
    assert [c["status"] for c in stored] == ["healthy", "down"]


def test_two_executors_run_an_expired_check_once_between_them(
    workers: WorkerProcs, namespace: str, fleet_redis: Any, tmp_path: Path
) -> None:
    """The lookup service's check has a 1 s TTL; two executors look for expired entries every 0.25 s."""
    start_fleet(workers, executors=2)
    client = AmqpClient()
    eventually(lambda: lines(tmp_path / "checks.txt"), message="a first check")
    began = time.time()
    corrs = []
    while time.time() - began < 10:
        corrs.append(submit(client, namespace, "picky")[0])
        time.sleep(0.5)
    ended = time.time()
    replies = client.replies(len(corrs), timeout=60)
    client.close()
    assert all(replies[c]["status"] == "succeeded" for c in corrs)
    checks = [line.split() for line in lines(tmp_path / "checks.txt")]
    within = [pid for pid, at in checks if began <= float(at) <= ended]
    # One checker each time the entry nears expiry: ~10 runs in 10 s (TTL 1 s, refreshed 0.35 s early, plus
    # up to a tick and the check's 0.2 s), where executors that did not claim it would run it ~1.5-2x as often.
    assert 5 <= len(within) <= 13, checks


def test_the_breaker_opens_lets_one_trial_through_across_executors_and_closes(
    workers: WorkerProcs, namespace: str, fleet_redis: Any, tmp_path: Path
) -> None:
    workers.env.update(AGENTFLEET_BREAKER_FAILURES="3", AGENTFLEET_BREAKER_COOLDOWN_S="2")
    client = AmqpClient()
    public = client.subscribe_public(namespace, "tool.health_changed")
    (tmp_path / "flaky-down").touch()
    start_fleet(workers, executors=2)
    body = tmp_path / "flaky-body.txt"

    failing = [submit(client, namespace, "flaky_caller", {"n": i})[0] for i in range(3)]
    got = client.replies(3, timeout=60)
    assert [seen(got[c])[0]["error_code"] for c in failing] == ["INTERNAL"] * 3
    refused = [submit(client, namespace, "flaky_caller", {"n": 10 + i})[0] for i in range(2)]
    got = client.replies(2, timeout=60)
    assert [seen(got[c])[0]["error_code"] for c in refused] == ["TOOL_UNAVAILABLE"] * 2
    assert len(lines(body)) == 3  # refused calls never entered the tool

    (tmp_path / "flaky-down").unlink()
    (tmp_path / "flaky-delay").write_text("1.5")  # the trial takes a while: the others arrive during it
    time.sleep(2.2)  # the cool-down
    trial = [submit(client, namespace, "flaky_caller", {"n": 20 + i})[0] for i in range(4)]
    got = client.replies(4, timeout=60)
    outcomes = sorted(seen(got[c])[0].get("error_code") or "ok" for c in trial)
    assert outcomes == ["TOOL_UNAVAILABLE"] * 3 + ["ok"], outcomes
    assert len(lines(body)) == 4  # exactly one trial call, fleet-wide

    events = health_events(client, public, 4, timeout=5)  # one more than expected: none may be repeated
    client.close()
    assert [(e["tool"], e["kind"], e["status"]) for e in events] == [
        ("flaky", "breaker", "open"), ("flaky", "breaker", "half_open"), ("flaky", "breaker", "closed")]


def test_a_repeated_read_only_call_is_a_cache_hit_marked_in_its_step(
    workers: WorkerProcs, namespace: str, store: Store, fleet_redis: Any, tmp_path: Path
) -> None:
    start_fleet(workers)
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "cached_twice")
    result = client.replies(1, timeout=60)[corr]
    client.close()
    assert seen(result) == [{"ok": True, "output": {"x": "a", "value": "A"}}] * 2
    assert lines(tmp_path / "read-body.txt") == ["a"]
    tool_steps = {s["call_id"]: s for s in store.steps(run_id) if s["kind"] == "tool"}
    assert tool_steps["r1"]["output"]["cache_hit"] is False
    assert tool_steps["r2"]["output"]["cache_hit"] is True


def test_runs_editing_one_ticket_take_turns_and_runs_on_different_tickets_do_not_wait(
    workers: WorkerProcs, namespace: str, fleet_redis: Any, tmp_path: Path
) -> None:
    start_fleet(workers, executors=2)
    client = AmqpClient()
    corrs = [submit(client, namespace, "ticket_editor", {"ticket": t, "hold_s": 1.0})[0] for t in "AABB"]
    replies = client.replies(4, timeout=60)
    client.close()
    assert all(replies[c]["status"] == "succeeded" and seen(replies[c])[0]["ok"] for c in corrs), replies
    spans: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    for line in lines(tmp_path / "ticket-intervals.txt"):
        ticket, start, end = line.split()
        spans[ticket].append((float(start), float(end)))
    for ticket in "AB":
        first, second = sorted(spans[ticket])
        assert first[1] <= second[0], spans  # never at once
    assert any(a[0] < b[1] and b[0] < a[1] for a in spans["A"] for b in spans["B"]), spans  # in parallel


@pytest.mark.chaos  # it stops the machine's Redis: no other test may run beside it
def test_with_redis_stopped_runs_finish_locked_tools_refuse_and_the_gate_returns(
    workers: WorkerProcs, namespace: str, fleet_redis: Any, fleet_seal: Any, tmp_path: Path
) -> None:
    from tests.helpers import redis_restarted

    # Planners re-read Redis every iteration here, so the first plan after Redis is back sees what the
    # check found (by default a good view, such as the fail-open one of the outage, is reused up to 1 s).
    workers.env.update(AGENTFLEET_GATE_VIEW_S="0")
    start_fleet(workers)
    client = AmqpClient()
    eventually(lambda: health(fleet_seal, namespace, "primary_lookup"), message="a first check")
    with redis_restarted() as outage:
        outage.wait_down()
        (tmp_path / "lookup-down").touch()  # a failure nobody can record while Redis is away
        picky_corr, _ = submit(client, namespace, "picky")
        locked_corr, _ = submit(client, namespace, "ticket_editor", {"ticket": "Z", "hold_s": 0.1})
        replies = client.replies(2, timeout=60)
        # The gate fails open: the primary is offered (its failure cannot be known) and runs.
        assert seen(replies[picky_corr])[0]["output"]["source"] == "primary"
        (locked,) = seen(replies[locked_corr])
        assert locked["error_code"] == "TRANSIENT" and "Redis is unreachable" in locked["message"]
        assert not (tmp_path / "ticket-intervals.txt").exists()  # never ran without its lock
    eventually(lambda: (health(fleet_seal, namespace, "primary_lookup") or {}).get("status") == "down",
               message="the gate is back with Redis")
    corr, _ = submit(client, namespace, "picky")
    assert seen(client.replies(1, timeout=60)[corr])[0]["output"]["source"] == "backup"
    client.close()
    per_worker = [log.read_text().count("Redis unreachable") for log in workers.logdir.glob("*.log")]
    assert max(per_worker) == 1 and sum(per_worker) >= 1, per_worker  # logged once per outage, not per call


def test_the_cli_shows_the_fleets_view_of_its_tools_and_health_exits_by_it(
    distributed_env: dict[str, str], namespace: str, fleet_redis: Any, fleet_seal: Any, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from agentfleet.fleet.gate import HealthEntry
    from tests.conftest import ROOT

    def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=60, env={**distributed_env, "PATH": "/usr/bin:/bin",
                                                         "PYTHONPATH": str(ROOT), **env})

    def sealed(key: str, value: str) -> None:
        fleet_redis.set(key, fleet_seal.seal(key, value))

    sealed(f"{namespace}:health:primary_lookup", HealthEntry("down", "refused", time.time() - 3, "executor-1").dumps())
    sealed(f"{namespace}:breaker:flaky", json.dumps({"state": "open", "since": time.time(), "failures": 5}))
    fleet_redis.set(f"{namespace}:cache-hits:counted_read", 7)
    shown = json.loads(cli("tools", "--json").stdout)
    assert shown["redis"] == "reachable"
    rows = {(r["agent"], r["tool"]): r for r in shown["tools"]}
    primary = rows[("picky", "primary_lookup")]
    assert (primary["health"], primary["detail"], primary["checked_by"], primary["fallback"], primary["tier"],
            primary["timeout_s"]) == ("down", "refused", "executor-1", "backup_lookup", "http", 3.0)
    assert primary["age_s"] >= 3 and not primary["available"]
    assert rows[("flaky_caller", "flaky")]["breaker"] == "open"
    assert rows[("cached_twice", "counted_read")]["cache_hits"] == 7
    assert rows[("ticket_editor", "edit_ticket")]["lock"] == "ticket:{ticket_id}"
    assert {r["tool"] for r in json.loads(cli("tools", "--agent", "picky", "--json").stdout)["tools"]} == {
        "primary_lookup", "backup_lookup"}

    down = cli("health", "--json")
    assert down.returncode == 1 and json.loads(down.stdout)["checks"]["lookup_service"]["status"] == "down"
    sealed(f"{namespace}:health:primary_lookup", HealthEntry("healthy", None, time.time(), "e").dumps())
    assert cli("health").returncode == 0
    fleet_redis.delete(f"{namespace}:health:primary_lookup")  # unknown: checked by the command itself
    (tmp_path / "lookup-down").touch()
    assert cli("health").returncode == 1
    gone = cli("health", "--json", AGENTFLEET_REDIS_URL="redis://127.0.0.1:1/0")
    assert gone.returncode == 1 and json.loads(gone.stdout)["redis"] == "unreachable"
    assert "Redis unreachable" in cli("tools", AGENTFLEET_REDIS_URL="redis://127.0.0.1:1/0",
                                      COLUMNS="300").stdout
