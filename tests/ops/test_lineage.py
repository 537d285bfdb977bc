"""Retry and fork. On the real fleet: a run failed at iteration 3 by a model outage goes on from its checkpoint
without repeating iterations 0-2's tool calls (the ledgers say); a fork from iteration 1 with edited input runs.
On the store: the last turn's calls are answered from what was recorded of them, never re-run."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from agentfleet import Agent, ScriptedModel, ToolCall, tool
from agentfleet import constants as C
from agentfleet.agents.registry import AgentRegistry
from agentfleet.errors import ConfigurationError
from agentfleet.loop.keys import idempotency_key, run_id_for
from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import Message, ToolResult
from agentfleet.ops.lineage import fork_goal, retry_goal
from agentfleet.store import Store
from agentfleet.store import tables as T
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, eventually, wait_for_run

pytestmark = pytest.mark.integration


def ledger(workspace: Path) -> list[str]:
    return sorted(line.split(":")[1] for f in workspace.glob("ledger-*.txt") for line in f.read_text().splitlines())


def test_a_failed_run_goes_on_from_its_checkpoint_and_a_fork_replans_with_edited_input(
        workers: WorkerProcs, namespace: str, store: Store, tmp_path: Path) -> None:
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    (tmp_path / "model-down").touch()
    client = AmqpClient()
    corr = client.publish_goal(namespace, "goal.steady", {"agent": "steady", "input": {}, "goal_id": "steady-1",
                                                          "progress": True})
    public = client.subscribe_public(namespace, "run.*")
    failed = client.replies(1, timeout=60)[corr]
    assert failed["status"] == "failed" and failed["error_code"] == "MODEL_ERROR", failed
    assert ledger(tmp_path) == ["run-e0", "run-e1", "run-e2"]
    source = run_id_for("steady", "steady-1")

    (tmp_path / "model-down").unlink()  # the outage is over
    rt_agents = _agents()
    retried = retry_goal(store, rt_agents, source)
    assert retried.payload["lineage"] == {"kind": "retry", "run_id": source, "through": 2}
    _publish(workers, retried)
    run = wait_for_run(store, retried.run_id)
    assert run.result and run.result["status"] == "succeeded", run.result
    assert run.result["output"]["seen"] == [4]  # it was shown iterations 0-2's results, and its own
    assert ledger(tmp_path) == ["run-e0", "run-e1", "run-e2", "run-e3"]  # none repeated
    assert run.lineage == {"kind": "retry", "run_id": source, "through": 2} and run.iteration == 4

    forked = fork_goal(store, rt_agents, source, 1, edit_input={"tag": "fork"})
    _publish(workers, forked)
    fork_run = wait_for_run(store, forked.run_id)
    assert fork_run.result and fork_run.result["status"] == "succeeded", fork_run.result
    assert ledger(tmp_path) == ["fork-e1", "fork-e2", "fork-e3", "run-e0", "run-e1", "run-e2", "run-e3"]
    assert fork_run.input == {"tag": "fork"} and fork_run.result["output"]["seen"] == [4]

    lineages: dict[str, object] = {}

    def heard_both() -> bool:  # each run's end is announced by the observer once it is stored
        while (got := client.channel.basic_get(public, auto_ack=True))[0] is not None:
            notice = json.loads(got[2])
            lineages[notice["run_id"]] = notice.get("lineage")
        return retried.run_id in lineages and forked.run_id in lineages

    eventually(heard_both, timeout=30, message="both ends on the public exchange")
    assert lineages[retried.run_id] == {"kind": "retry", "run_id": source, "through": 2}
    assert lineages[forked.run_id] == {"kind": "fork", "run_id": source, "through": 0}
    client.close()
    with pytest.raises(ConfigurationError, match="only a failed or cancelled run"):
        retry_goal(store, rt_agents, retried.run_id)  # it succeeded


def _agents() -> AgentRegistry:
    from agentfleet.agents.registry import fleet_agents
    from agentfleet.config.settings import get_settings

    return fleet_agents(get_settings())


def _publish(workers: WorkerProcs, event: object) -> None:
    from agentfleet.config.settings import get_settings
    from agentfleet.roles.runtime import runtime_for
    from agentfleet.workers.app import create_app

    runtime_for(create_app(get_settings())).publisher.publish([event])  # type: ignore[list-item]


@tool
def lookup(q: str) -> dict:
    """Look something up."""
    return {"q": q}


@tool
def charge(amount: int) -> dict:
    """Charge a card (not idempotent)."""
    return {"charged": amount}


def test_the_last_turns_calls_are_answered_from_what_was_recorded(store: Store) -> None:
    agent = Agent("payer", instructions="Pay.", model=ScriptedModel([]), goal_schema={"type": "object"},
                  result_schema={"type": "object"}, tools=[lookup, charge], register=False)
    agents = AgentRegistry()
    agents.add(agent)
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    calls = [ToolCall(id="a", name="lookup", arguments={"q": "x"}), ToolCall(id="b", name="lookup", arguments={}),
             ToolCall(id="c", name="charge", arguments={"amount": 5}), ToolCall(id="d", name="lookup", arguments={})]
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="payer", goal_id=run_id, trace_id="t", input={}, limits={})
        conn.execute(T.runs.update().where(T.runs.c.run_id == run_id).values(state=RunState.FAILED.value,
                                                                               iteration=1))
        store.write_messages(conn, run_id, [(0, 0, Message(role="assistant", tool_calls=[calls[0]])),
                                            (0, 1, Message(role="tool", tool_call_id="a", name="lookup", content="{}")),
                                            (1, 0, Message(role="assistant", tool_calls=calls))])
        store.record_observation(conn, run_id=run_id, iteration=1, call_id="a", tool="lookup",
                                 result=ToolResult(ok=True, output={"seen": "a"}).model_dump(mode="json"))
    for call, status in (("b", "succeeded"), ("c", "started")):
        store.begin_step(key=idempotency_key(run_id, 1, "tool", call), run_id=run_id, iteration=1, kind="tool",
                         call_id=call)
        if status == "succeeded":
            with store.tx() as conn:
                store.finish_step(conn, idempotency_key(run_id, 1, "tool", call), status="succeeded",
                                  output=ToolResult(ok=True, output={"seen": "b"}).model_dump(mode="json"),
                                  duration_ms=1.0)
    goal = retry_goal(store, agents, run_id)
    assert goal.payload["lineage"] == {"kind": "retry", "run_id": run_id, "through": 1}
    told = {m["tool_call_id"]: m["content"] for m in goal.payload["carried"]}
    assert '"seen": "a"' in told["a"] and '"seen": "b"' in told["b"]  # recorded: not run again
    assert "UNKNOWN_OUTCOME" in told["c"]  # started, not idempotent: may have taken effect
    assert "NOT_RUN" in told["d"]  # never started
    with pytest.raises(ConfigurationError, match="has iterations 0 to 1"):
        fork_goal(store, agents, run_id, 5)
    assert fork_goal(store, agents, run_id, 1).payload["lineage"]["through"] == 0
    assert store.lineage_history({"kind": "fork", "run_id": run_id, "through": 0}).messages[1].tool_call_id == "a"
