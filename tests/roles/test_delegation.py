"""Delegation on the embedded fleet: a call answered by a child run, fan-in, one budget per tree, cancellation."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.loop.states import RunState
from agentfleet.store.records import RunRecord
from agentfleet.store.repository import Store
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, eventually, wait_for_run


@pytest.fixture(scope="module")  # one fleet for the module: its warm shutdown takes seconds
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    tmp_path = tmp_path_factory.mktemp("fleet")
    with embedded_fleet(tmp_path, "tests.fixtures.agents") as running:
        yield running


def tree(store: Store, run_id: str) -> list[RunRecord]:
    out = []
    for child in store.children(run_id):
        out += [child, *tree(store, child.run_id)]
    return out


def test_two_delegations_and_a_plain_call_fan_in_and_the_child_results_are_the_tool_results(
        fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "asker", "input": {"queries": ["alpha", "beta"]}}))
    assert run.state == RunState.SUCCEEDED, run.result
    seen = run.result["output"]["seen"]  # type: ignore[index]
    by_call = {s["output"].get("agent", "echo") + ":" + str(i): s for i, s in enumerate(seen)}
    assert [s["ok"] for s in seen] == [True, True, True], by_call
    answers = sorted(s["output"]["output"]["seen"][0] for s in seen if s["output"].get("agent") == "lookup")
    assert answers == ["kb:alpha", "kb:beta"]
    children = fleet.store.children(run.run_id)
    assert sorted(c.agent for c in children) == ["lookup", "lookup"]
    assert all(c.trace_id == run.trace_id and c.parent["run_id"] == run.run_id for c in children)  # type: ignore[index]
    assert all(c.input in ({"q": "alpha"}, {"q": "beta"}) for c in children)  # the child sees only its input
    # The tree's spend is counted in the root: its own turns and its children's.
    assert run.steps_used == 2 + sum(c.steps_used for c in children)


def test_a_child_that_fails_is_a_structured_error_the_parent_model_sees(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "asker", "input": {"queries": ["boom", "fine"]}}))
    assert run.state == RunState.SUCCEEDED, run.result
    seen = run.result["output"]["seen"]  # type: ignore[index]
    failed = [s for s in seen if not s["ok"]]
    [child] = [c for c in fleet.store.children(run.run_id) if c.state == RunState.FAILED]
    assert len(failed) == 1 and failed[0]["error_code"] == child.error_code
    assert child.run_id in failed[0]["message"] and "another agent" in failed[0]["hint"]


def test_a_delegation_sent_twice_starts_one_child(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "asker", "input": {"queries": ["once"]}}))
    assert run.state == RunState.SUCCEEDED
    [goal] = [e for e in fleet.store.stored_events(run.run_id) if e["type"] == "goal.submitted"
              and e["payload"].get("parent")]  # the child's goal, in the parent's outbox
    again = Envelope.model_validate({**goal, "event_id": "a-second-copy-of-the-goal"})
    fleet.runtime.publisher.publish([again])
    time.sleep(1.0)
    assert [c.agent for c in fleet.store.children(run.run_id)] == ["lookup"]


def test_a_budget_exhausted_in_a_grandchild_stops_the_whole_tree_with_token_budget(fleet: EmbeddedFleet) -> None:
    root = wait_for_run(fleet.store, fleet.submit({"agent": "chain_root", "input": {}}))
    [middle] = fleet.store.children(root.run_id)
    [leaf] = fleet.store.children(middle.run_id)
    assert [(r.agent, r.state, r.error_code) for r in (root, middle, leaf)] == [
        ("chain_root", RunState.FAILED, "TOKEN_BUDGET"), ("chain_middle", RunState.FAILED, "TOKEN_BUDGET"),
        ("chain_leaf", RunState.FAILED, "TOKEN_BUDGET")]
    assert middle.limits["max_tokens"] == 40 and leaf.limits["max_tokens"] == 20  # what was left, each level
    assert root.input_tokens + root.output_tokens == 60


def test_cancelling_the_root_cancels_every_descendant(fleet: EmbeddedFleet) -> None:
    root_id = fleet.submit({"agent": "cancel_root", "input": {}})
    leaf = eventually(lambda: next((r for r in tree(fleet.store, root_id) if (r.agent == "counter"
                                    and r.state == RunState.WAITING_CHILDREN) or (r.agent == "counter"
                                    and r.state == RunState.EXECUTING)), None), timeout=30)
    assert fleet.store.get_run(root_id).state == RunState.WAITING_CHILDREN  # type: ignore[union-attr]
    fleet.runtime.publisher.publish([Envelope.new(EventType.RUN_CANCEL_REQUESTED, root_id,
                                                  RunCancelRequested(reason="changed my mind"), trace_id="t")])
    assert wait_for_run(fleet.store, root_id).state == RunState.CANCELLED
    for run in eventually(lambda: [r for r in tree(fleet.store, root_id) if r.state == RunState.CANCELLED]
                          if all(r.state == RunState.CANCELLED for r in tree(fleet.store, root_id)) else None,
                          timeout=30):
        assert "parent run" in run.result["message"]  # type: ignore[index]
    assert leaf.agent == "counter"


def test_a_policy_over_delegate_is_enforced_by_the_executor(fleet: EmbeddedFleet) -> None:
    run = wait_for_run(fleet.store, fleet.submit({"agent": "guarded_asker", "input": {"queries": ["secret", "ok"]}}))
    assert run.state == RunState.SUCCEEDED, run.result
    codes = sorted(str(s.get("error_code")) for s in run.result["output"]["seen"])  # type: ignore[index]
    assert codes == ["None", "None", "PERMISSION_DENIED"]
    assert [c.input for c in fleet.store.children(run.run_id)] == [{"q": "ok"}]


def test_a_child_never_outlives_its_roots_deadline(fleet: EmbeddedFleet) -> None:
    """The root waits (no plan, so no gate of its own) while its child is in a long tool call: the sweeper
    ends the root at its deadline, and the child is cancelled with it, its tool stopped."""
    from datetime import timedelta

    from agentfleet.roles.sweeper import sweep
    from agentfleet.store.records import now

    root_id = fleet.submit({"agent": "patient", "input": {}, "limits": {"deadline_s": 3}})
    child = eventually(lambda: next((c for c in fleet.store.children(root_id) if c.state == RunState.EXECUTING),
                                    None), timeout=30)
    assert child.limits["deadline_s"] <= 3  # what was left of the root's
    assert fleet.store.get_run(root_id).state == RunState.WAITING_CHILDREN  # type: ignore[union-attr]
    later = now() + timedelta(seconds=fleet.runtime.settings.stall_after_s + 60)
    assert any(f.run_id == root_id and f.action == "expire" for f in sweep(fleet.runtime, at=later))
    root = wait_for_run(fleet.store, root_id)
    assert (root.state, root.error_code) == (RunState.FAILED, "DEADLINE")
    ended = wait_for_run(fleet.store, child.run_id, timeout=15)  # counting 80 would take 4 s more; it stops
    assert ended.state == RunState.CANCELLED and "parent run" in ended.result["message"]  # type: ignore[index]


def test_siblings_spend_from_one_live_tree_budget(fleet: EmbeddedFleet) -> None:
    """One budget, not a share each: the child that needs more may use what its sibling left, and the tree
    stops once it has spent the root's limit (over by at most the turn in flight), at every level."""
    root = wait_for_run(fleet.store, fleet.submit({"agent": "fan_root", "input": {}}))
    children = {c.agent: c for c in fleet.store.children(root.run_id)}
    greedy, modest = children["greedy"], children["modest"]
    assert modest.state == RunState.SUCCEEDED and modest.input_tokens + modest.output_tokens == 20
    assert (greedy.state, greedy.error_code) == (RunState.FAILED, "TOKEN_BUDGET"), greedy.result
    assert "tree" in greedy.result["message"]  # type: ignore[index]  # stopped by the root's budget, not its own
    spent = greedy.input_tokens + greedy.output_tokens
    assert spent >= 150  # far past an even share (95): its sibling needed 20
    assert (root.state, root.error_code) == (RunState.FAILED, "TOKEN_BUDGET")
    assert 200 <= root.input_tokens + root.output_tokens == 10 + 20 + spent <= 200 + 20


def test_a_child_whose_goal_was_still_queued_when_its_root_ended_never_takes_a_turn(fleet: EmbeddedFleet) -> None:
    """Containment 14: with the planner busy, a root cancelled while WAITING_CHILDREN left its subtree running
    (25/25 descendants succeeded): their goals were still queued, so there was no run to send a cancel to."""
    from agentfleet.events.envelope import GoalSubmitted, ParentCall
    from agentfleet.loop.keys import child_goal_id, run_id_for

    root_id = fleet.submit({"agent": "cancel_root", "input": {}})
    eventually(lambda: (r := fleet.store.get_run(root_id)) is not None and r.state == RunState.WAITING_CHILDREN,
               timeout=30)
    fleet.runtime.publisher.publish([Envelope.new(EventType.RUN_CANCEL_REQUESTED, root_id,
                                                  RunCancelRequested(reason="stop everything"), trace_id="t")])
    root = wait_for_run(fleet.store, root_id)
    assert root.state == RunState.CANCELLED
    # The goal of a child its root handed off just before the cancel, picked up only now (the planner was busy).
    late_goal = child_goal_id(root_id, "late-call")
    fleet.runtime.publisher.publish([Envelope.new(EventType.GOAL_SUBMITTED, run_id_for("counter", late_goal),
                                                  GoalSubmitted(agent="counter", goal_id=late_goal,
                                                                input={"upto": 100000},
                                                                parent=ParentCall(run_id=root_id, agent="cancel_root",
                                                                                  iteration=0, call_id="late-call",
                                                                                  sibling_call_ids=["late-call"],
                                                                                  ancestors=[root_id])),
                                                  trace_id=root.trace_id)])
    late = wait_for_run(fleet.store, run_id_for("counter", late_goal))
    assert late.state == RunState.CANCELLED and late.steps_used == 0, late.result
    assert f"its ancestor run {root_id}" in late.result["message"]  # type: ignore[index]
    assert [s for s in fleet.store.steps(late.run_id) if s["kind"] == "tool"] == []  # no tool ever ran for it
