"""Each worker process serves its own metrics; after one known run they moved by exactly what it did."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentfleet import constants as C
from agentfleet.store.repository import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, eventually, free_port

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def ledger_run(namespace: str) -> dict:
    """One run of the ledger agent (4 appends, 3 echoes, 3 model turns) through the inbox; its Result."""
    client = AmqpClient()
    client.publish_goal(namespace, "goal.ledger", {"agent": "ledger", "input": {}})
    [reply] = client.replies(1, timeout=60).values()
    client.close()
    assert reply["status"] == "succeeded", (reply.get("error_code"), reply.get("message"))
    return reply


def test_each_worker_counts_what_it_did_in_one_run(workers: WorkerProcs, namespace: str, store: Store) -> None:
    ports = {role: free_port() for role in C.ROLES}
    for role in C.ROLES:
        workers.start(role, "--metrics-port", str(ports[role]))
    workers.wait_ready()
    reply = ledger_run(namespace)

    def settled() -> dict[str, dict]:
        got = {role: scrape(port) for role, port in ports.items()}
        ended = sum(value(s, "agentfleet_runs_ended_total", agent="ledger", state="SUCCEEDED", reason="")
                    for s in got.values())
        return got if ended == 1 else {}

    got = eventually(settled, timeout=10, message="the run's end counted")
    planner, executor, observer = got[C.PLANNER], got[C.EXECUTOR], got[C.OBSERVER]
    assert value(planner, "agentfleet_runs_started_total", agent="ledger") == 1
    assert value(planner, "agentfleet_runs_ended_total", agent="ledger", state="SUCCEEDED", reason="") == 1
    assert value(planner, "agentfleet_model_calls_total", model="scripted", outcome="ok") == 3
    assert value(planner, "agentfleet_model_tokens_total", model="scripted", kind="output") == 30
    # Handled once: "published", or, when its first publish fails for a passing reason after the commit, "retried"
    # and then "duplicate" (the stored outcome published again). A full run once counted no "published" here and the
    # cause was not caught; the counts by outcome are now in the failure's message.
    handled = {outcome: value(planner, "agentfleet_events_handled_total", role="planner", event="goal.submitted",
                              outcome=outcome) for outcome in ("published", "duplicate", "retried")}
    assert handled["published"] + handled["duplicate"] == 1, handled
    assert handled["duplicate"] == handled["retried"], handled
    assert value(executor, "agentfleet_tool_calls_total", tool="append_ledger", code="ok") == 4
    assert value(executor, "agentfleet_tool_calls_total", tool="slow_echo", code="ok") == 3
    assert value(executor, "agentfleet_events_handled_total", role="executor", event="tool.requested",
                 outcome="published") == 7
    assert value(observer, "agentfleet_events_handled_total", role="observer", event="tool.completed",
                 outcome="published") == 7
    for samples in (executor, observer):  # each counts only its own work
        assert value(samples, "agentfleet_model_calls_total", model="scripted", outcome="ok") == 0
    assert ("agentfleet_queue_depth", (("role", "planner"),)) in planner

    trail = store.audit_trail(reply["run_id"])  # the real fleet writes the same trail as the embedded one
    assert [r["to_state"] for r in trail] == ["PLANNING", "EXECUTING", "OBSERVING", "PLANNING", "EXECUTING",
                                              "OBSERVING", "PLANNING", "SUCCEEDED"]
    assert {r["worker"].split("@")[0].split(".")[0] for r in trail} == {C.PLANNER, C.OBSERVER}


def test_a_prefork_executor_serves_what_its_children_counted(workers: WorkerProcs, namespace: str) -> None:
    port = free_port()
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR, "--pool", "prefork", "--concurrency", "2", "--metrics-port", str(port))
    workers.wait_ready()
    ledger_run(namespace)
    samples = eventually(lambda: (s := scrape(port)) and value(s, "agentfleet_tool_calls_total",
                                                               tool="append_ledger", code="ok") == 4 and s,
                         timeout=10, message="the children's tool calls, summed by the parent")
    assert value(samples, "agentfleet_tool_calls_total", tool="slow_echo", code="ok") == 3
    assert value(samples, "agentfleet_events_handled_total", role="executor", event="tool.requested",
                 outcome="published") == 7
    assert ("agentfleet_queue_depth", (("role", "executor"),)) in samples
