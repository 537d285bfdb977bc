"""A step whose lock outlives its holder is retried, not acked away; a step that fails for good ends its run."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from agentfleet import constants as C
from agentfleet.loop.keys import idempotency_key, run_id_for
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, step_held

pytestmark = pytest.mark.integration


def test_a_step_whose_lock_outlives_a_dead_holder_is_retried_until_it_runs(
    workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path
) -> None:
    """What a SIGKILLed executor leaves for ~15 ms: its session (and advisory lock) not yet closed by Postgres.

    Here the test holds that lock itself, for 3 s, while the step's message is delivered: before the fix the
    executor acked the message as "held elsewhere" and the run stayed EXECUTING for ever.
    """
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    goal_id = f"held-{uuid.uuid4().hex}"
    run_id = run_id_for("single", goal_id)
    key = idempotency_key(run_id, 0, "tool", "w1")
    with step_held(store, key):
        client = AmqpClient()
        corr = client.publish_goal(namespace, "goal.single", {"agent": "single", "input": {}, "goal_id": goal_id})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not workers.logged("step will be retried"):
            time.sleep(0.1)
        assert workers.logged("step will be retried")
        time.sleep(2)
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", workers.logs()
    assert (tmp_path / f"ledger-{run_id}.txt").read_text().count(":only:") == 1
    assert [s["attempts"] for s in store.steps(run_id) if s["kind"] == "tool"] == [1]
    # The retry's copy is described as the first was (Celery's "received" line, Flower): which event, not its payload
    # (a tool's arguments, a carried result).
    received = [line for line in workers.logs().splitlines() if "Task tool.requested[" in line and "received" in line]
    assert received and not any("payload" in line or "idempotency_key" in line for line in received), received[:1]


def test_a_goal_that_no_planner_can_take_ends_with_a_result_and_a_reasoned_dead_letter(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    """The inbox admitted it, but the planner that gets it does not load the agent (a rolling deploy gone
    wrong): it is retried for the window in case another planner does, then answered, never left silent."""
    from agentfleet.config.settings import get_settings
    from agentfleet.events.contracts import Goal
    from agentfleet.ops.client import FleetClient
    from agentfleet.roles.admission import goal_event

    workers.env.update(AGENTFLEET_AGENTS="agentfleet.examples.repo_report", AGENTFLEET_STEP_RETRY_WINDOW_S="1")
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    client = AmqpClient()
    goal = Goal(agent="single", input={}, goal_id=f"orphan-{uuid.uuid4().hex}")
    with FleetClient(get_settings()) as fleet:  # this process loads 'single'; its settings are the fleet's
        fleet.rt.publisher.publish([goal_event(goal, reply_to=client.reply_queue, correlation_id="c1")])
    reply = client.replies(1, timeout=60).get("c1")
    dead = client.drain(f"{namespace}.dead", 1, timeout=10)
    client.close()
    assert reply is not None and reply["status"] == "rejected" and reply["error_code"] == "UNKNOWN_AGENT", reply
    assert "does not load it" in reply["message"]
    assert dead and dead[0][0].headers[C.HEADER_DEAD_ERROR_CODE] == "UNKNOWN_AGENT"
    assert workers.logged("step will be retried")

