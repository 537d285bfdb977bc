"""Retry and fork: a new run that starts from another run's checkpoint instead of from nothing.

* ``retry``: a run that failed or was cancelled goes on from its last good checkpoint. Its model turns and the
  results its tools recorded are the new run's start (read from the old run's transcript, not copied); it plans
  next where the old one would have. A call of the old run's last turn whose result never reached its transcript
  is answered from what was recorded of it: its result if one was; UNKNOWN_OUTCOME if it was started and may have
  taken effect (a tool that is not idempotent: the model decides, with the idempotency key stable, what to do);
  NOT_RUN if it never started or its tool may safely run again. Nothing is re-run behind the model's back.
* ``fork``: a new run with the old run's transcript up to an iteration, optionally with its input edited, which
  plans that iteration again.

Both are new runs (the old one stays as it ended) whose ``lineage`` names the old one, shown by ``status``,
``trace`` and the public exchange (``run.completed`` / ``run.failed``).
"""

from __future__ import annotations

import uuid
from typing import Any

from agentfleet.agents.registry import AgentRegistry
from agentfleet.errors import ConfigurationError, ErrorCode
from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted
from agentfleet.loop.decisions import schema_errors
from agentfleet.loop.keys import idempotency_key, run_id_for
from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import Message, ToolResult
from agentfleet.store.records import RunRecord
from agentfleet.store.repository import Store

RETRYABLE = (RunState.FAILED, RunState.CANCELLED)


def _source(store: Store, run_id: str) -> RunRecord:
    run = store.get_run(run_id)
    if run is None:
        raise ConfigurationError(f"no run {run_id}")
    if run.parent_run_id is not None:
        raise ConfigurationError(f"run {run_id} was delegated by run {run.parent_run_id}, which has its answer "
                                 "already: retry or fork that run")
    return run


def retry_goal(store: Store, agents: AgentRegistry, run_id: str, *, goal_id: str | None = None,
               max_steps: int | None = None) -> Envelope:
    """The goal of a run that goes on from where ``run_id`` (failed or cancelled) stopped."""
    run = _source(store, run_id)
    if run.state not in RETRYABLE:
        hint = ("it succeeded: fork it to run it again from an iteration" if run.state == RunState.SUCCEEDED
                else "it has not ended: cancel it first")
        raise ConfigurationError(f"run {run_id} is {run.state.value}; only a failed or cancelled run is retried "
                                 f"({hint})")
    turn = _last_turn(store, run)
    if turn is None:  # no turn of its own (a retry that stopped before its first): from where it started
        through, carried = run.iteration - 1, []
    else:
        at, calls, answered = turn
        through = at
        carried = [] if answered else [_carried(store, agents, run, at, call) for call in calls]
    limits = dict(run.limits)
    if max_steps is not None:
        limits["max_steps"] = max_steps
    return _goal(run, "retry", through, run.input, limits, carried,
                 goal_id or f"retry-{run.run_id[:12]}-{uuid.uuid4().hex[:8]}")


def fork_goal(store: Store, agents: AgentRegistry, run_id: str, from_iteration: int, *,
              edit_input: dict[str, Any] | None = None, goal_id: str | None = None) -> Envelope:
    """The goal of a new run with ``run_id``'s transcript before ``from_iteration``, which plans that iteration
    again (with ``edit_input``'s fields over the goal's input)."""
    run = _source(store, run_id)
    if not 0 <= from_iteration <= run.iteration:
        raise ConfigurationError(f"run {run_id} has iterations 0 to {run.iteration}; --from {from_iteration} is "
                                 "not one of them")
    if from_iteration > 0 and not _answered(store, run, from_iteration - 1):
        raise ConfigurationError(f"iteration {from_iteration - 1} of run {run_id} has no recorded results: fork from "
                                 f"an earlier iteration, or retry the run")
    new_input = {**run.input, **(edit_input or {})}
    agent = agents.get(run.agent)
    if agent is not None and (problems := schema_errors(agent.goal_schema, new_input)):
        raise ConfigurationError(f"the edited input breaks the goal schema of {run.agent!r}: {'; '.join(problems)}")
    return _goal(run, "fork", from_iteration - 1, new_input, dict(run.limits), [],
                 goal_id or f"fork-{run.run_id[:12]}-{from_iteration}-{uuid.uuid4().hex[:8]}")


def _goal(run: RunRecord, kind: str, through: int, input: dict[str, Any], limits: dict[str, Any],
          carried: list[Message], goal_id: str) -> Envelope:
    lineage = {"kind": kind, "run_id": run.run_id, "through": through}
    goal = GoalSubmitted(agent=run.agent, goal_id=goal_id, input=input, limits=limits, progress=run.progress,
                         lineage=lineage, carried=[m.model_dump(mode="json") for m in carried])
    return Envelope.new(EventType.GOAL_SUBMITTED, run_id_for(run.agent, goal_id), goal, trace_id=uuid.uuid4().hex)


def _last_turn(store: Store, run: RunRecord) -> tuple[int, list[Any], bool] | None:
    """The run's last model turn: its iteration, its calls, and whether their results are in its transcript."""
    for at in range(run.iteration, -1, -1):
        messages = store.messages_at(run.run_id, at)
        turn = next((m for m in messages if m.role == "assistant"), None)
        if turn is not None:
            return at, list(turn.tool_calls), any(m.role == "tool" for m in messages)
    return None


def _answered(store: Store, run: RunRecord, iteration: int) -> bool:
    return any(m.role == "tool" for m in store.messages_at(run.run_id, iteration))


def _carried(store: Store, agents: AgentRegistry, run: RunRecord, iteration: int, call: Any) -> Message:
    """A call of the last turn, answered from what was recorded of it."""
    result = _recorded(store, agents, run, iteration, call)
    return Message(role="tool", tool_call_id=call.id, name=call.name, content=result.for_model_json())


def _recorded(store: Store, agents: AgentRegistry, run: RunRecord, iteration: int, call: Any) -> ToolResult:
    with store.reading() as conn:
        seen = {o["call_id"]: o["result"] for o in store.observations(conn, run.run_id, iteration)}
    if call.id in seen:
        return ToolResult.model_validate(seen[call.id])
    key = idempotency_key(run.run_id, iteration, "tool", call.id)
    step = next((s for s in store.steps(run.run_id) if s["idempotency_key"] == key), None)
    if step is not None and step["status"] in ("succeeded", "failed") and isinstance(step["output"], dict):
        return ToolResult.model_validate(step["output"])
    agent = agents.get(run.agent)
    tool = agent.tool(call.name) if agent is not None else None
    if step is not None and step["status"] == "started" and (tool is None or not tool.idempotent):
        return ToolResult.failure(
            ErrorCode.UNKNOWN_OUTCOME, f"{call.name} was started before the run stopped and its outcome was never "
            "recorded: it may or may not have taken effect",
            "Check the outside system's state (the call's idempotency key is stable) before calling again.")
    return ToolResult.failure(ErrorCode.NOT_RUN, f"{call.name} did not run to an end before the run stopped",
                              "Call it again if you still need it.")
