"""The whole fleet in one process (memory broker, SQLite): the loop's behaviour end to end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfleet.constants import REPAIR_MESSAGE_NAME
from agentfleet.errors import ErrorCode, GoalRejected
from agentfleet.loop.states import RunState
from agentfleet.ops.progress import step_line
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, wait_for_run


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print('hi')\n" * 7)
    (workspace / "README.md").write_text("# demo\n")
    with embedded_fleet(workspace, "agentfleet.examples.repo_report,tests.fixtures.agents") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def run(fleet: EmbeddedFleet, agent: str, input: dict, **extra: object) -> tuple[str, dict]:
    run_id = fleet.submit({"agent": agent, "input": input, **extra})
    record = wait_for_run(fleet.store, run_id, timeout=30)
    assert record.result is not None
    return run_id, record.result


def test_the_example_agent_reports_on_real_files(fleet: EmbeddedFleet) -> None:
    run_id, result = run(fleet, "repo_report", {"path": "src"})
    assert result["status"] == "succeeded", result
    out = result["output"]
    assert out["files"] == 1 and out["total_lines"] == 7
    assert out["largest_file"] == {"path": "src/main.py", "lines": 7}
    assert out["largest_file_head"].startswith("print('hi')")
    assert result["usage"]["steps"] == 3
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    tools = [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"]
    assert len(plans) == 3 and len(tools) == 3
    assert {s["iteration"] for s in tools if s["name"] in ("list_files", "count_lines")} == {0}


def test_every_tool_failure_is_an_observation_not_a_crash(fleet: EmbeddedFleet) -> None:
    _, result = run(fleet, "troubled", {"n": 1})
    assert result["status"] == "succeeded", result
    codes = {r.get("error_code") for r in result["output"]["seen"]}
    assert {ErrorCode.TIMEOUT, ErrorCode.INTERNAL, ErrorCode.PERMISSION_DENIED, ErrorCode.UNKNOWN_TOOL,
            ErrorCode.INVALID_ARGUMENTS} <= codes


def test_side_effects_happen_once_per_call(fleet: EmbeddedFleet) -> None:
    run_id, result = run(fleet, "ledger", {})
    assert result["status"] == "succeeded"
    lines = (fleet.workspace / f"ledger-{run_id}.txt").read_text().splitlines()  # type: ignore[attr-defined]
    assert sorted(line.split(":")[1] for line in lines) == ["four", "one", "three", "two"]


def test_a_model_that_repeats_itself_ends_with_no_progress(fleet: EmbeddedFleet) -> None:
    _, result = run(fleet, "looper", {})
    assert result["status"] == "failed" and result["error_code"] == ErrorCode.NO_PROGRESS
    assert result["usage"]["steps"] == 3


def test_a_runaway_loop_ends_at_max_steps(fleet: EmbeddedFleet) -> None:
    _, result = run(fleet, "stepper", {})
    assert result["error_code"] == ErrorCode.MAX_STEPS and result["usage"]["steps"] == 3


def test_a_goal_may_tighten_max_steps(fleet: EmbeddedFleet) -> None:
    _, result = run(fleet, "stepper", {}, limits={"max_steps": 1})
    assert result["error_code"] == ErrorCode.MAX_STEPS and result["usage"]["steps"] == 1


def test_an_answer_that_breaks_the_result_schema_is_told_back_then_fails_output_invalid(fleet: EmbeddedFleet) -> None:
    run_id, result = run(fleet, "sloppy", {})
    assert result["status"] == "failed" and result["error_code"] == ErrorCode.OUTPUT_INVALID
    assert "done" in result["message"]
    assert result["usage"]["steps"] == 4  # the first answer and three repairs (DEFAULT_MAX_REPAIRS)
    notes = [m for m in fleet.store.transcript(run_id) if m.name == REPAIR_MESSAGE_NAME]
    assert len(notes) == 3 and "'yes' is not of type 'boolean'" in (notes[0].content or "")


def test_a_goal_may_allow_no_repairs(fleet: EmbeddedFleet) -> None:
    _, result = run(fleet, "sloppy", {}, limits={"max_repairs": 0})
    assert result["error_code"] == ErrorCode.OUTPUT_INVALID and result["usage"]["steps"] == 1


def test_progress_says_when_the_model_answered_without_tool_calls() -> None:
    step = {"kind": "plan", "iteration": 2, "status": "succeeded", "duration_ms": 5.0, "output": {"calls": []}}
    assert step_line(step) == "iteration 2: model → an answer without tool calls (5 ms)"


def test_malformed_arguments_and_an_undeclared_tool_are_repaired_and_the_run_succeeds(fleet: EmbeddedFleet) -> None:
    run_id, result = run(fleet, "fumbler", {})
    assert result["status"] == "succeeded", result
    messages = fleet.store.transcript(run_id)
    told = {m.tool_call_id: json.loads(m.content or "") for m in messages if m.role == "tool"}
    assert told["c1"]["error_code"] == ErrorCode.INVALID_ARGUMENTS and "not JSON" in told["c1"]["message"]
    assert told["c2"]["error_code"] == ErrorCode.UNKNOWN_TOOL and "slow_echo, final_answer" in told["c2"]["message"]
    assert [m.role for m in messages[:4]] == ["assistant", "tool", "tool", "user"]  # each call answered by id
    assert messages[3].name == REPAIR_MESSAGE_NAME and "slow_echo" in (messages[3].content or "")
    steps = fleet.store.steps(run_id)
    assert [s["iteration"] for s in steps if s["kind"] == "tool"] == [1]  # nothing of the unusable turn ran
    assert "told back: unusable tool calls: arguments are not JSON" in step_line(steps[0])


def test_the_same_goal_id_twice_is_one_run(fleet: EmbeddedFleet) -> None:
    first = fleet.submit({"agent": "ledger", "input": {}, "goal_id": "same-goal"})
    second = fleet.submit({"agent": "ledger", "input": {}, "goal_id": "same-goal"})
    assert first == second
    record = wait_for_run(fleet.store, first)
    assert record.state == RunState.SUCCEEDED
    lines = (fleet.workspace / f"ledger-{first}.txt").read_text().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 4


def test_a_schema_breaking_goal_never_reaches_a_model(fleet: EmbeddedFleet) -> None:
    with pytest.raises(GoalRejected) as err:
        fleet.submit({"agent": "troubled", "input": {"n": "one"}})
    assert err.value.code == ErrorCode.INPUT_INVALID


def test_a_run_cancelled_mid_iteration_ends_cancelled_and_ignores_late_results(fleet: EmbeddedFleet) -> None:
    import time

    from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested

    run_id = fleet.submit({"agent": "fanout", "input": {}})  # 8 tool calls of 0.4 s, 4 at a time
    deadline = time.monotonic() + 30
    while (run := fleet.store.get_run(run_id)) is None or run.state != RunState.EXECUTING:
        assert time.monotonic() < deadline, run
        time.sleep(0.01)
    fleet.runtime.publisher.publish([Envelope.new(EventType.RUN_CANCEL_REQUESTED, run_id,
                                                  RunCancelRequested(reason="test"), trace_id="t")])
    record = wait_for_run(fleet.store, run_id)
    assert record.state == RunState.CANCELLED
    assert record.result and record.result["status"] == "cancelled" and record.result["message"] == "test"
    # The calls already dispatched finish; their results arrive after the end and change nothing.
    while len([s for s in fleet.store.steps(run_id) if s["kind"] == "tool" and s["status"] != "started"]) < 8:
        assert time.monotonic() < deadline + 30
        time.sleep(0.05)
    after = fleet.store.get_run(run_id)
    assert after is not None and after.state == RunState.CANCELLED and after.steps_used == 1


def test_the_cli_runs_the_example_end_to_end(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "agentfleet.cli", "run", "repo_report", "--input", '{"path": "agentfleet/loop"}',
         "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={"PATH": "/usr/bin:/bin", "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/cli.db",
             "PYTHONPATH": str(ROOT), "AGENTFLEET_WORKSPACE": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "succeeded" and result["output"]["files"] >= 5


def test_the_cli_exits_non_zero_on_a_rejected_goal(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "agentfleet.cli", "run", "repo_report", "--input", '{"path": 1}', "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={"PATH": "/usr/bin:/bin", "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/cli.db",
             "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error_code"] == "INPUT_INVALID"


@pytest.mark.parametrize("du", ["du", "/no/such/du"])
def test_the_health_gate_example_falls_back_when_its_check_fails_and_says_so(tmp_path: Path, du: str) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "agentfleet.cli", "run", "disk_usage", "--input", '{"path": "agentfleet/loop"}'],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={"PATH": "/usr/bin:/bin", "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/cli.db",
             "PYTHONPATH": str(ROOT), "AGENTFLEET_DEMO_DU": du, "COLUMNS": "500", "AGENTFLEET_WORKSPACE": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    broken = du != "du"
    assert result["output"]["measured_by"] == ("walk" if broken else "du")
    assert result["output"]["kib"] > 0
    said = "gate: Tools unavailable now: du_usage (its health check failed; use walk_usage instead)."
    assert (said in proc.stdout) is broken, proc.stdout


def test_a_model_adapter_that_raises_is_logged_with_its_traceback_and_the_run_fails_with_model_error(
        fleet: EmbeddedFleet, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("ERROR", logger="agentfleet.roles.planner"):
        run_id, result = run(fleet, "model_breaks", {})
    assert result["status"] == "failed" and result["error_code"] == ErrorCode.MODEL_ERROR, result
    assert "Traceback" not in result["message"]
    [record] = [r for r in caplog.records if r.name == "agentfleet.roles.planner" and r.levelname == "ERROR"]
    assert record.exc_info is not None and run_id in str(record.exc_info[1])
    assert "in _adapter_bug" in caplog.text  # the adapter's own frame
    assert record.model == "scripted"  # type: ignore[attr-defined]


def test_model_calls_are_retried_once_layer_deep_and_only_for_passing_errors(fleet: EmbeddedFleet) -> None:
    from tests.fixtures.agents import _tries

    run_id, result = run(fleet, "busy_model", {})
    assert result["status"] == "succeeded" and _tries[run_id] == 3, result  # two 429s, then the answer
    run_id, result = run(fleet, "bad_key", {})
    assert (result["status"], result["error_code"], _tries[run_id]) == ("failed", ErrorCode.MODEL_AUTH, 1)
    assert "API key" in result["recovery_suggestion"]
    run_id, result = run(fleet, "runs_out", {})  # was tried three times as if it were a network error
    assert (result["status"], result["error_code"], _tries[run_id]) == ("failed", ErrorCode.MODEL_ERROR, 1)
