"""Graphs run by the fleet (embedded: one process, the same code): the tidy example's loop, its agent node as a
child run, its fan-out and join; a map of fifty branches joined once; each node a checkpointed step."""

from __future__ import annotations

import pytest

from agentfleet.loop.states import RunState
from agentfleet.ops.trace import trace_lines, trace_of
from tests.helpers import embedded_fleet, wait_for_run

MESSY = "def f():\n\treturn 1   \nx = 2"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with embedded_fleet(tmp_path_factory.mktemp("graphs"), "agentfleet.examples.tidy,tests.graphs.wide",
                        AGENTFLEET_APPROVAL_POLL_S="0.2") as running:
        yield running


def test_the_tidy_graph_loops_through_its_agent_then_fans_out_and_joins(fleet) -> None:  # type: ignore[no-untyped-def]
    run = wait_for_run(fleet.store, fleet.submit({"agent": "tidy", "input": {"source": MESSY}}))
    assert run.state == RunState.SUCCEEDED, run.result
    out = run.result["output"]  # type: ignore[index]
    assert out["source"] == "def f():\n    return 1\nx = 2\n" and out["problems"] == []
    assert out["fixes"] == ["line 2", "final newline"]
    assert out["report"] == "3 lines, 7 words; 2 fix(es): line 2, final newline"
    steps = fleet.store.steps(run.run_id)
    ran = sorted((s["iteration"], s["name"]) for s in steps if s["kind"] == "tool")  # a step's nodes run at once
    # lint, fix (a child run), lint again, the two counts in one step, the report: each node once, checkpointed.
    assert ran == [(0, "node_lint"), (1, "delegate"), (2, "node_lint"), (3, "node_count_lines"),
                   (3, "node_count_words"), (4, "node_report")]
    assert all(s["status"] in ("succeeded", "delegated") for s in steps if s["kind"] == "tool")
    [child] = fleet.store.children(run.run_id)
    assert child.agent == "tidier" and child.state == RunState.SUCCEEDED
    trace = trace_of(fleet.store, run.run_id, fleet.runtime.agents)
    assert trace is not None
    text = "\n".join(trace_lines(trace))
    assert "tidier" in text


def test_a_clean_text_goes_straight_to_the_counts(fleet) -> None:  # type: ignore[no-untyped-def]
    run = wait_for_run(fleet.store, fleet.submit({"agent": "tidy", "input": {"source": "all good\n"}}))
    assert run.state == RunState.SUCCEEDED, run.result
    assert run.result["output"]["report"] == "1 lines, 2 words; nothing to fix"  # type: ignore[index]
    assert fleet.store.children(run.run_id) == []


def test_a_goal_that_breaks_the_state_is_refused_before_a_run(fleet) -> None:  # type: ignore[no-untyped-def]
    from agentfleet.errors import GoalRejected

    with pytest.raises(GoalRejected) as raised:
        fleet.submit({"agent": "tidy", "input": {"source": 7}})
    assert raised.value.code == "INPUT_INVALID"


def test_fifty_branches_fan_out_and_join_once(fleet) -> None:  # type: ignore[no-untyped-def]
    run = wait_for_run(fleet.store, fleet.submit({"agent": "wide", "input": {"n": 50}}))
    assert run.state == RunState.SUCCEEDED, run.result
    assert run.result["output"]["total"] == sum(i * i for i in range(50))  # type: ignore[index]
    tools = [s["name"] for s in fleet.store.steps(run.run_id) if s["kind"] == "tool"]
    assert tools.count("node_square") == 50 and tools.count("node_add") == 1


def test_a_graph_node_a_person_approves_and_a_node_over_its_time(fleet) -> None:  # type: ignore[no-untyped-def]
    from agentfleet.events.contracts import ApprovalResolve
    from agentfleet.roles.approvals import resolve
    from tests.helpers import eventually

    run_id = fleet.submit({"agent": "outer", "input": {"n": 4}})
    eventually(lambda: fleet.store.pending_approvals(run_id=run_id), timeout=30)
    [child] = fleet.store.children(run_id)  # the inner graph ran as a child run first
    assert child.agent == "wide" and child.state == RunState.SUCCEEDED
    [pending] = fleet.store.pending_approvals(run_id=run_id)
    assert pending.tool == "node_ship" and "asks before node 'ship' runs" in (pending.reason or "")
    assert not any(s["name"] == "node_ship" and s["status"] == "succeeded" for s in fleet.store.steps(run_id))
    resolve(fleet.runtime, ApprovalResolve(run_id=run_id, call_id=pending.call_id, decision="approve"), "ann",
            publish=False)
    run = wait_for_run(fleet.store, run_id, timeout=60)
    assert run.state == RunState.SUCCEEDED, run.result
    out = run.result["output"]  # type: ignore[index]
    assert out["total"] == 0 + 1 + 4 + 9 and out["shipped"] == "shipped 14" and out["napped"] == ""
    [napped] = [s for s in fleet.store.steps(run_id) if s["name"] == "node_nap"]
    assert napped["output"]["error_code"] == "TIMEOUT"


def test_the_console_shows_a_graph_runs_path_and_its_agent_nodes_child_run(fleet) -> None:  # type: ignore[no-untyped-def]
    import html

    from starlette.testclient import TestClient

    from agentfleet.config.settings import get_settings
    from agentfleet.console.app import create_console

    run = wait_for_run(fleet.store, fleet.submit({"agent": "tidy", "input": {"source": MESSY}}))
    console = TestClient(create_console(get_settings(), fleet.runtime), base_url="http://127.0.0.1")
    page = html.unescape(console.get(f"/runs/{run.run_id}").text)
    [child] = fleet.store.children(run.run_id)
    assert f'data-tree-run="{child.run_id}"' in page and "tidier" in page
    assert "edge lint → fix" in page and "taken" in page  # the path: which edges were judged, and how
    assert "node_count_lines" in page and "node_count_words" in page
