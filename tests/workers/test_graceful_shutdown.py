"""SIGTERM finishes the step in hand, then stops consuming: no UNKNOWN_OUTCOME from a polite stop."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agentfleet import constants as C
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, tool_started

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_sigterm_mid_call_lets_the_call_finish_once_and_the_worker_exit_cleanly(
    workers: WorkerProcs, namespace: str, tmp_path: Path
) -> None:
    workers.start(C.PLANNER)
    workers.start(C.OBSERVER)
    executor = workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    corr = client.publish_goal(namespace, "goal.slow_side_effect", {"agent": "slow_side_effect", "input": {}})
    tool_started(tmp_path)
    os.kill(executor.pid, signal.SIGTERM)  # the tool sleeps 4 s before its side effect
    assert executor.wait(timeout=30) == 0, workers.logs()
    workers.start(C.EXECUTOR)  # in case anything was handed back: nothing should be
    result = client.replies(1, timeout=60).get(corr)
    client.close()
    assert result is not None and result["status"] == "succeeded", workers.logs()
    assert result["output"]["seen"] == [{"ok": True, "output": {"written": "once"}}]  # not UNKNOWN_OUTCOME
    assert len(next(tmp_path.glob("ledger-*.txt")).read_text().splitlines()) == 1
