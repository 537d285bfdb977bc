"""The hook seam on the embedded fleet: the audit trail, metrics, and hooks of the user's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from agentfleet.errors import ConfigurationError
from agentfleet.hooks.loading import user_hooks
from agentfleet.hooks.metrics import PrometheusHook
from agentfleet.store import tables as T
from agentfleet.workers.embedded import EmbeddedFleet
from tests.fixtures.hooks import Recorder
from tests.helpers import embedded_fleet, eventually, wait_for_run


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    workspace = tmp_path_factory.mktemp("ws")
    with embedded_fleet(workspace, "tests.fixtures.agents", AGENTFLEET_METRICS_PORT="0",
                        AGENTFLEET_AUDIT_LOG=str(workspace / "audit.jsonl"),
                        AGENTFLEET_HOOKS="tests.fixtures.hooks:Broken,tests.fixtures.hooks:Recorder") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def metrics(fleet: EmbeddedFleet) -> PrometheusHook:
    hook = fleet.runtime.hooks.find(PrometheusHook)
    assert hook is not None
    return hook


def ledger_run(fleet: EmbeddedFleet) -> str:
    run_id = fleet.submit({"agent": "ledger", "input": {}})
    record = wait_for_run(fleet.store, run_id, timeout=60)
    assert record.result is not None and record.result["status"] == "succeeded", record.result
    return run_id


def test_the_audit_trail_has_one_record_per_transition_in_order(fleet: EmbeddedFleet) -> None:
    run_id = ledger_run(fleet)
    trail = fleet.store.audit_trail(run_id)
    moves = [(r["from_state"], r["to_state"]) for r in trail]
    assert moves == [("PENDING", "PLANNING"), ("PLANNING", "EXECUTING"), ("EXECUTING", "OBSERVING"),
                     ("OBSERVING", "PLANNING"), ("PLANNING", "EXECUTING"), ("EXECUTING", "OBSERVING"),
                     ("OBSERVING", "PLANNING"), ("PLANNING", "SUCCEEDED")], moves
    assert [r["at"] for r in trail] == sorted(r["at"] for r in trail)
    assert [r["iteration"] for r in trail] == [0, 0, 0, 1, 1, 1, 2, 2]
    # What moved it: the goal, then each iteration's last tool result and its observation.
    assert [r["event_type"] for r in trail] == [
        "goal.submitted", "goal.submitted", "tool.completed", "observation.recorded", "observation.recorded",
        "tool.completed", "observation.recorded", "observation.recorded"]
    with fleet.store.engine.connect() as conn:  # each was an event of this run that a worker handled
        handled = set(conn.execute(select(T.processed_events.c.event_id)
                                   .where(T.processed_events.c.run_id == run_id)).scalars())
    assert {r["event_id"] for r in trail} <= handled and len({r["event_id"] for r in trail}) == 5
    assert all(r["worker"] and r["step_duration_ms"] is not None and r["step_duration_ms"] >= 0 for r in trail)
    run = fleet.store.get_run(run_id)
    assert run is not None
    assert (trail[-1]["input_tokens"], trail[-1]["output_tokens"], trail[-1]["cost_usd"]) == (
        run.input_tokens, run.output_tokens, run.cost_usd)
    assert trail[-1]["reason"] is None
    # The audit log file has the same records, once committed (as JSON lines, nothing else in that file).
    logged = [json.loads(line) for line in (fleet.workspace / "audit.jsonl").read_text().splitlines()]  # type: ignore[attr-defined]
    mine = [(r["from_state"], r["to_state"], r["event_id"]) for r in logged if r["run_id"] == run_id]
    # (each line is written by its worker thread right after its commit: compare as records, not by position)
    assert sorted(mine) == sorted((r["from_state"], r["to_state"], r["event_id"]) for r in trail)


def test_a_run_that_fails_is_audited_with_its_error_code(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "model_breaks", "input": {}})
    wait_for_run(fleet.store, run_id, timeout=30)
    last = fleet.store.audit_trail(run_id)[-1]
    assert (last["from_state"], last["to_state"], last["reason"]) == ("PLANNING", "FAILED", "MODEL_ERROR")


def test_metrics_move_by_exactly_what_one_run_did(fleet: EmbeddedFleet) -> None:
    m = metrics(fleet)
    names = {
        "started": ("agentfleet_runs_started_total", {"agent": "ledger"}),
        "ended": ("agentfleet_runs_ended_total", {"agent": "ledger", "state": "SUCCEEDED", "reason": ""}),
        "appends": ("agentfleet_tool_calls_total", {"tool": "append_ledger", "code": "ok"}),
        "echoes": ("agentfleet_tool_calls_total", {"tool": "slow_echo", "code": "ok"}),
        "model_ok": ("agentfleet_model_calls_total", {"model": "scripted", "outcome": "ok"}),
        "input_tokens": ("agentfleet_model_tokens_total", {"model": "scripted", "kind": "input"}),
        "goals": ("agentfleet_events_handled_total", {"role": "planner", "event": "goal.submitted",
                                                      "outcome": "published"}),
        "tool_steps": ("agentfleet_events_handled_total", {"role": "executor", "event": "tool.requested",
                                                           "outcome": "published"}),
        "tool_seconds": ("agentfleet_tool_duration_seconds_count", {"tool": "append_ledger"}),
    }

    def read() -> dict[str, float]:
        return {k: m.registry.get_sample_value(name, labels) or 0.0 for k, (name, labels) in names.items()}

    before = read()
    ledger_run(fleet)
    expected = {"started": 1, "ended": 1, "appends": 4, "echoes": 3, "model_ok": 3, "input_tokens": 30, "goals": 1,
                "tool_steps": 7, "tool_seconds": 4}
    eventually(lambda: {k: read()[k] - before[k] for k in expected} == expected, timeout=10,
               message=f"moved {({k: read()[k] - before[k] for k in expected})}, expected {expected}")


def test_the_metrics_endpoint_serves_the_counters_and_queue_depths(fleet: EmbeddedFleet) -> None:
    ledger_run(fleet)
    addr, port = metrics(fleet).serve(0, "127.0.0.1")  # already served by the worker: this returns where
    body = httpx.get(f"http://{addr}:{port}/metrics", timeout=10).text
    assert 'agentfleet_runs_ended_total{agent="ledger",reason="",state="SUCCEEDED"}' in body
    assert 'agentfleet_queue_depth{role="executor"}' in body
    assert "agentfleet_step_duration_seconds_bucket" in body


def test_user_hooks_see_every_step_tool_and_model_call_and_a_broken_hook_stops_nothing(fleet: EmbeddedFleet) -> None:
    run_id = ledger_run(fleet)  # succeeded although Broken raised from every method
    # 18 steps: the goal, 7 tool calls, 7 tool results, 2 observations and the run's end (its notice)
    seen = eventually(lambda: (s := Recorder.seen.get(run_id)) and sum(1 for e in s if e[0] == "after_step") == 18
                      and list(s), timeout=10)
    tools = [e for e in seen if e[0] == "after_tool"]
    assert sorted(e[2] for e in tools) == ["a1", "a2", "a3", "a4", "e1", "e2", "e3"]
    assert all(e[3] is True and e[4] is True for e in tools)
    assert sum(1 for e in seen if e[0] == "before_tool") == 7
    assert [e[1:] for e in seen if e[0] in ("after_model",)] == [(0, True), (1, True), (2, True)]
    befores = sum(1 for e in seen if e[0] == "before_step")
    afters = [e for e in seen if e[0] == "after_step"]
    assert befores == len(afters) and all(e[3] in ("published", "duplicate") for e in afters)


def test_hooks_named_in_settings_that_cannot_be_loaded_are_configuration_errors() -> None:
    for spec, said in [("tests.fixtures.hooks", "not module:attribute"),
                       ("tests.fixtures.no_such:Hook", "cannot be loaded"),
                       ("tests.fixtures.hooks:Nope", "cannot be loaded"),
                       ("tests.fixtures.hooks:not_a_hook", "not a Hook")]:
        with pytest.raises(ConfigurationError, match=said):
            user_hooks(spec)
    assert [type(h).__name__ for h in user_hooks(" tests.fixtures.hooks:Recorder , ")] == ["Recorder"]


def test_trace_tells_what_happened_to_a_run_and_runs_lists_it(fleet: EmbeddedFleet) -> None:
    import json

    from typer.testing import CliRunner

    from agentfleet.cli import app
    from agentfleet.ops.trace import trace_lines, trace_of

    run_id = ledger_run(fleet)
    found = trace_of(fleet.store, run_id, fleet.runtime.agents)
    assert found is not None
    assert [it["iteration"] for it in found["iterations"]] == [0, 1, 2]
    first, second, last = found["iterations"]
    assert first["model"]["decision"] == "6 tool calls: " + ", ".join(["append_ledger"] * 3 + ["slow_echo"] * 3)
    assert sorted(c["call_id"] for c in first["tools"]) == ["a1", "a2", "a3", "e1", "e2", "e3"]
    assert all(c["ok"] and c["attempts"] == 1 and c["worker"] for c in first["tools"] + second["tools"])
    assert [c["arguments"] for c in second["tools"]] == [{"entry": "four"}]
    assert last["model"]["decision"] == "final answer" and last["tools"] == []
    assert (first["model"]["input_tokens"], first["model"]["output_tokens"]) == (10, 10)
    assert [(t["from"], t["to"]) for t in found["transitions"]][-1] == ("PLANNING", "SUCCEEDED")
    assert found["end"]["status"] == "succeeded"

    cli = CliRunner()
    listed = cli.invoke(app, ["runs", "--embedded", "--agent", "ledger", "--state", "succeeded", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert run_id in {r["run_id"] for r in rows} and {r["state"] for r in rows} == {"SUCCEEDED"}
    assert cli.invoke(app, ["runs", "--embedded", "--state", "nope"]).exit_code == 2
    none = cli.invoke(app, ["runs", "--embedded", "--agent", "ledger", "--state", "FAILED", "--json"])
    assert none.exit_code == 0 and none.stdout == ""
    shown = cli.invoke(app, ["trace", run_id, "--embedded"], terminal_width=60)
    assert shown.exit_code == 0, shown.output
    # Piped to a narrow terminal, every line comes out whole (the CLI re-reads the run: the same lines).
    assert shown.stdout.splitlines() == trace_lines(found)
    assert json.loads(cli.invoke(app, ["trace", run_id, "--embedded", "--json"]).stdout)["run_id"] == run_id
    assert cli.invoke(app, ["trace", "no-such-run", "--embedded"]).exit_code == 2


def test_tool_names_a_model_made_up_do_not_each_become_a_metrics_series(fleet: EmbeddedFleet) -> None:
    """A label per made-up name would grow a worker's memory without bound; they share one."""
    run_id = fleet.submit({"agent": "tool_spray", "input": {}})
    assert wait_for_run(fleet.store, run_id).result["status"] == "succeeded"  # type: ignore[index]
    registry = metrics(fleet).registry
    unknown = eventually(lambda: registry.get_sample_value(
        "agentfleet_tool_calls_total", {"tool": "(unknown)", "code": "UNKNOWN_TOOL"}), timeout=10)
    assert unknown >= 20
    made_up = [s for f in registry.collect() for s in f.samples if "made_up" in s.labels.get("tool", "")]
    assert made_up == []


def test_the_preflight_checks_user_hooks_without_making_them(tmp_path: Path) -> None:
    from agentfleet.config.settings import Settings
    from agentfleet.store.db import upgrade
    from agentfleet.workers.preflight import preflight
    from tests.fixtures.hooks import Counted

    url = f"sqlite:///{tmp_path}/pre.db"
    upgrade(url)
    before = Counted.made
    preflight(Settings(profile="embedded", embedded_database_url=url, hooks="tests.fixtures.hooks:Counted",
                       agents="tests.fixtures.agents"))
    assert Counted.made == before  # made once, by the runtime that uses it


def test_runs_refuses_a_limit_below_one_as_a_usage_error(fleet: EmbeddedFleet) -> None:
    from typer.testing import CliRunner

    from agentfleet.cli import app

    for limit in ("0", "-1"):
        done = CliRunner().invoke(app, ["runs", "--embedded", "--limit", limit])
        assert done.exit_code == 2, done.output
