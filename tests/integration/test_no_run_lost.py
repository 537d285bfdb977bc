"""A step whose lock outlives its holder is retried, not acked away; a step that fails for good ends its run."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from agentfleet import constants as C
from agentfleet.loop.keys import idempotency_key, run_id_for
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, step_held


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
        while time.monotonic() < deadline and "step will be retried" not in workers.logs():
            time.sleep(0.1)
        assert "step will be retried" in workers.logs()
        time.sleep(2)
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", workers.logs()
    assert (tmp_path / f"ledger-{run_id}.txt").read_text().count(":only:") == 1
    assert [s["attempts"] for s in store.steps(run_id) if s["kind"] == "tool"] == [1]
