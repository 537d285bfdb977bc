"""A worker SIGKILLed in the middle of a tool call: the step is redelivered, never silently repeated."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, tool_started

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_a_non_idempotent_call_cut_short_becomes_unknown_outcome_not_a_second_call(
    workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path
) -> None:
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    victim = workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    corr = client.publish_goal(namespace, "goal.slow_side_effect", {"agent": "slow_side_effect", "input": {}})

    marker = tool_started(tmp_path)
    os.kill(victim.pid, signal.SIGKILL)  # mid-call: the tool is sleeping before its side effect
    victim.wait()

    workers.start(C.EXECUTOR)  # RabbitMQ redelivers the unacked tool.requested here
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None, workers.logs()
    assert result["status"] == "succeeded", result
    seen = result["output"]["seen"]
    assert [s["error_code"] for s in seen] == [ErrorCode.UNKNOWN_OUTCOME]
    run_id = result["run_id"]
    assert not (tmp_path / f"ledger-{run_id}.txt").exists()  # the killed attempt never wrote
    assert len(marker.read_text().splitlines()) == 1  # and the tool body was not entered again
    tool_step = next(s for s in store.steps(run_id) if s["kind"] == "tool")
    assert tool_step["attempts"] == 2 and tool_step["worker"] == workers.name(C.EXECUTOR, 3)


def _crashes_until_answered(workers: WorkerProcs, namespace: str, agent: str, role: str, client: AmqpClient,
                            timeout_s: float = 120) -> tuple[dict[str, Any] | None, int]:
    """The other two roles started, a goal for ``agent``, and a worker of ``role`` started again each time one dies,
    until the goal is answered: the answer and the crashes."""
    for other in {C.PLANNER, C.EXECUTOR, C.OBSERVER} - {role}:
        workers.start(other)
    workers.wait_ready()
    corr = client.publish_goal(namespace, f"goal.{agent}", {"agent": agent, "input": {}})
    crashes = 0
    result = None
    deadline = time.monotonic() + timeout_s
    while result is None and time.monotonic() < deadline:
        worker = workers.start(role)
        while worker.poll() is None and result is None and time.monotonic() < deadline:
            result = client.replies(1, timeout=0.5).get(corr)
        if worker.poll() is not None:
            crashes += 1
    return result, crashes


def test_a_call_that_keeps_killing_its_worker_is_dead_lettered_not_looped(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    client = AmqpClient()
    result, crashes = _crashes_until_answered(workers, namespace, "crasher", C.EXECUTOR, client)
    dead = client.drain(f"{namespace}.dead", 1)
    client.close()
    assert result is not None, workers.logs()
    assert crashes == 3  # max_step_attempts, then no more
    assert result["status"] == "succeeded"  # the model was told, and finished
    assert [s["error_code"] for s in result["output"]["seen"]] == [ErrorCode.POISON_MESSAGE]
    assert dead and dead[0][0].headers[C.HEADER_DEAD_ERROR_CODE] == ErrorCode.POISON_MESSAGE


def test_a_model_that_keeps_killing_its_planner_ends_the_run_after_as_many_crashes_as_a_tool(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    """The planner asks this model first, writing nothing of the iteration before the call (``model_first``): the
    attempt that dies leaves no intent to count it. Its redelivery writes one counting it, so the run still ends
    POISON_MESSAGE after max_step_attempts crashes, not one more."""
    client = AmqpClient()
    result, crashes = _crashes_until_answered(workers, namespace, "model_crasher", C.PLANNER, client)
    client.close()
    assert result is not None, workers.logs()
    assert crashes == 3, crashes  # max_step_attempts, then no more
    assert result["status"] == "failed" and result["error_code"] == ErrorCode.POISON_MESSAGE, result
    plan = next(s for s in store.steps(result["run_id"]) if s["kind"] == "plan" and s["iteration"] == 1)
    assert plan["status"] == "failed" and plan["attempts"] == 4, plan


def test_an_executor_killed_mid_subprocess_tool_takes_the_sandbox_with_it_and_the_run_ends(
    workers: WorkerProcs, namespace: str, store: Store
) -> None:
    """bwrap's --die-with-parent: no tool process outlives its executor; the redelivered call (nap is not
    idempotent) becomes UNKNOWN_OUTCOME, not a second nap."""
    from tests.fixtures.agents import NAP_MARKER
    from tests.helpers import eventually, processes_with

    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    corr = client.publish_goal(namespace, "goal.napper", {"agent": "napper", "input": {"seconds": 90}})
    eventually(lambda: processes_with(NAP_MARKER), timeout=60, message="the nap never started")
    assert workers.kill(workers.name(C.EXECUTOR, 2))
    eventually(lambda: not processes_with(NAP_MARKER), timeout=10, message="the tool outlived its executor")
    workers.start(C.EXECUTOR)
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", result
    assert [s["error_code"] for s in result["output"]["seen"]] == [ErrorCode.UNKNOWN_OUTCOME]
    assert processes_with(NAP_MARKER) == []
