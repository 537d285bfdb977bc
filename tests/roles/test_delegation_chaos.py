"""Chaos for delegation: workers SIGKILLed while a delegation is handed off or while its parent waits.

Every run of the tree ends, and each delegation starts exactly one child."""

from __future__ import annotations

import pytest

from agentfleet import constants as C
from agentfleet.loop.states import RunState
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.fleet.test_health_gate_fleet import submit
from tests.helpers import AmqpClient, eventually

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_a_planner_killed_around_the_hand_off_starts_one_child_per_delegation(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    """The planner starts children in the transaction that records the model's turn: killed around it, the
    turn is planned again (or its committed outbox sent again), and each delegation still has one child."""
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "asker", {"queries": ["one", "two", "three"]})
    eventually(lambda: store.get_run(run_id), timeout=60, message="the run never started")
    assert workers.kill(workers.name(C.PLANNER, 0))  # mid hand-off, or just before or after it
    workers.start(C.PLANNER)
    result = client.replies(1, timeout=90).get(corr)
    assert result is not None and result["status"] == "succeeded", result
    children = store.children(run_id)
    assert sorted(c.input["q"] for c in children) == ["one", "three", "two"]  # one child per delegation
    assert all(c.state == RunState.SUCCEEDED for c in children)


def test_an_executor_killed_while_a_parent_waits_beside_a_plain_call_loses_nothing(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    """The plain call beside the delegations dies with its executor: redelivered, it ends; the children's
    answers and its own fan in."""
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "asker", {"queries": ["four", "five"]})
    eventually(lambda: any(s["kind"] == "tool" for s in store.steps(run_id)), timeout=60,
               message="no tool step began")
    assert workers.kill(workers.name(C.EXECUTOR, 2))
    workers.start(C.EXECUTOR)
    result = client.replies(1, timeout=90).get(corr)
    assert result is not None and result["status"] == "succeeded", result
    assert sorted(c.input["q"] for c in store.children(run_id)) == ["five", "four"]


def test_a_planner_killed_while_the_parent_waits_on_its_child_loses_nothing(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "patient")
    eventually(lambda: (r := store.get_run(run_id)) and r.state == RunState.WAITING_CHILDREN, timeout=60,
               message="the parent never waited on its child")
    assert workers.kill(workers.name(C.PLANNER, 0))
    workers.start(C.PLANNER)
    result = client.replies(1, timeout=120).get(corr)
    assert result is not None and result["status"] == "succeeded", result
    [child] = store.children(run_id)
    assert child.agent == "counter" and child.state == RunState.SUCCEEDED
