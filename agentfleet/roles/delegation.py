"""Delegation, every path in one place: an agent's call of the built-in ``delegate`` tool becomes a child run
(handed off by the planner, or by the executor once a person approved it), the parent waits for its children,
and a child's Result becomes the parent call's answer.

Agents never call each other. Handling a ``delegate`` call publishes the child's
``goal.submitted`` (with the parent's run and call; the child's goal id derived from
them, so a redelivered call names the same child run) and marks the call's step
``delegated``; nothing waits in a worker. When the child ends, the observer turns its
Result into the parent call's tool result, and it fans in with the iteration's other
calls. The child sees only the input it was given; the parent gets back only the
child's validated output (or its error code), never its transcript. Every descendant
spends from the root's limits: a child starts with what remains, each of its model
turns is counted in every ancestor's spend as it is recorded, and before each turn it
checks every ancestor's limits too (siblings draw on one budget, live).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from agentfleet.agents.registry import Agent
from agentfleet.constants import DELEGATE_TOOL
from agentfleet.errors import AgentfleetError, ErrorCode, ToolError
from agentfleet.events.contracts import Result, ResultStatus
from agentfleet.events.envelope import (
    DelegationStarted,
    Envelope,
    EventType,
    GoalSubmitted,
    ParentCall,
    RunCancelRequested,
    ToolFinished,
    ToolRequested,
)
from agentfleet.loop.budgets import Limits, Termination, remaining
from agentfleet.loop.decisions import schema_errors
from agentfleet.loop.keys import child_goal_id, derived_event_id, idempotency_key, run_id_for
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.loop.transcript import ToolCall, ToolResult
from agentfleet.roles import step_notices
from agentfleet.roles.approvals import policy_verdict
from agentfleet.roles.step import Step
from agentfleet.store.records import RunRecord

DELEGATED = "delegated"  # a step whose call a child run answers
CHILD_FAILED_HINT = "Decide with this: call the agent again with a better input, ask another agent, or give up."


def refusal(step: Step, parent: RunRecord, agent: Agent, arguments: dict[str, Any]) -> ToolResult | None:
    """Why this delegation cannot start (a structured result for the model), or None: it can."""
    child_name = arguments.get("agent")
    child = step.rt.agent(child_name) if isinstance(child_name, str) else None
    if child_name not in agent.delegates or child is None:
        return ToolResult.failure(ErrorCode.UNKNOWN_AGENT, f"{agent.name} may not delegate to {child_name!r}",
                                  f"Delegate to one of: {', '.join(agent.delegates)}.")
    problems = schema_errors(child.goal_schema, arguments.get("input"))
    if problems:
        return ToolResult.failure(ErrorCode.INPUT_INVALID, f"the input breaks {child.name}'s goal schema: "
                                                           f"{'; '.join(problems)}",
                                  f"Pass {child.name} an input matching its goal schema.")
    budget = child_limits(parent)
    if isinstance(budget, Termination):
        return ToolResult.failure(budget.code, f"nothing left to give {child.name}: {budget.message}")
    return None


def child_limits(parent: RunRecord) -> Limits | Termination:
    return remaining(Limits.model_validate(parent.limits), parent.usage, parent.steps_used, parent.elapsed_s())


def child_goal(step: Step, parent: RunRecord, iteration: int, call: ToolCall, sibling_call_ids: list[str],
               arguments: dict[str, Any]) -> Envelope:
    """The child's goal, to commit with the call's step marked ``delegated`` (its id derived from the call)."""
    budget = child_limits(parent)
    assert isinstance(budget, Limits), "refusal() checked the budget"
    goal = GoalSubmitted(agent=arguments["agent"], goal_id=child_goal_id(parent.run_id, call.id),
                         input=arguments["input"], limits=budget.model_dump(exclude={"max_repairs"}),
                         parent=ParentCall(run_id=parent.run_id, agent=parent.agent, iteration=iteration,
                                           call_id=call.id, sibling_call_ids=sibling_call_ids,
                                           ancestors=[*parent.ancestors, parent.run_id]),
                         progress=parent.progress)
    return Envelope.new(EventType.GOAL_SUBMITTED, run_id_for(goal.agent, goal.goal_id), goal,
                        trace_id=step.env.trace_id, causation_id=step.env.event_id,
                        event_id=derived_event_id(parent.run_id, "delegation", iteration, call.id))


def planner_hands_off(step: Step, agent: Agent, call: ToolCall) -> bool:
    """Whether the planner hands this call off itself (no executor hop, never queued behind slow tools): a
    ``delegate`` call no policy sends to a person. One that needs approval goes to the executor, which parks it."""
    if call.name != DELEGATE_TOOL or not agent.delegates:
        return False
    _, verdict = policy_verdict(step, agent, agent.tools[DELEGATE_TOOL], call.arguments)
    return verdict is None or verdict.action == "allow"  # no verdict: nothing to decide, or the hand-off refuses


def hand_off_from_planner(step: Step, conn: Connection, parent: RunRecord, agent: Agent, iteration: int,
                          call: ToolCall, sibling_call_ids: list[str]) -> tuple[list[Envelope], bool]:
    """Start a delegated call's child (or answer why not) in the planner's transaction: its events, and
    whether a child was started. The call's step is recorded as the executor would have (same key)."""
    key = idempotency_key(parent.run_id, iteration, "tool", call.id)
    refused = _bound_refusal(step, parent, agent, call.arguments)
    if refused is None:
        step.rt.store.record_step(conn, key=key, run_id=parent.run_id, iteration=iteration, call_id=call.id,
                                  name=call.name, input=call.arguments, worker=step.worker, status=DELEGATED,
                                  output={"child_run_id": run_id_for(call.arguments["agent"],
                                                                     child_goal_id(parent.run_id, call.id))})
        return [child_goal(step, parent, iteration, call, sibling_call_ids, call.arguments)], True
    step.rt.store.record_step(conn, key=key, run_id=parent.run_id, iteration=iteration, call_id=call.id,
                              name=call.name, input=call.arguments, worker=step.worker, status="failed",
                              output=refused.model_dump(mode="json"))
    finished = ToolFinished(agent=parent.agent, iteration=iteration, call_id=call.id, tool=call.name,
                            sibling_call_ids=sibling_call_ids, result=refused, worker=step.worker)
    return [step.event(EventType.TOOL_FAILED, finished, key=(iteration, call.id, "finished"))], False


def _bound_refusal(step: Step, parent: RunRecord, agent: Agent, arguments: dict[str, Any]) -> ToolResult | None:
    try:
        bound = agent.tools[DELEGATE_TOOL].bind(arguments)
    except ToolError as exc:
        return ToolResult.failure(exc.code, exc.message, exc.hint)
    return refusal(step, parent, agent, bound)


def answer_parent(step: Step, child: RunRecord, result: Result) -> list[Envelope]:
    """The child's end as its parent's tool result (once: the event id is derived from the child run)."""
    if child.parent is None:
        return []
    parent = ParentCall.model_validate(child.parent)
    if result.status == ResultStatus.SUCCEEDED:
        # Not the child's run id: no tool takes one, operators find the child by its parent link (`agentfleet
        # trace`, the tree), and a small model shown it stopped answering (measured: Qwen2.5-Coder-1.5B wrote
        # only newlines after two results carrying run ids, and the final answer after the same results without).
        told = ToolResult(ok=True, output={"agent": child.agent, "output": result.output})
    else:
        told = ToolResult.failure(
            result.error_code or ErrorCode.INTERNAL,
            f"{child.agent} run {child.run_id} {result.status}: {result.message or result.error_code}",
            CHILD_FAILED_HINT)
    finished = ToolFinished(agent=parent.agent, iteration=parent.iteration, call_id=parent.call_id,
                            tool="delegate", sibling_call_ids=parent.sibling_call_ids, result=told)
    kind = EventType.TOOL_COMPLETED if told.ok else EventType.TOOL_FAILED
    return [Envelope.new(kind, parent.run_id, finished, trace_id=step.env.trace_id, causation_id=step.env.event_id,
                         event_id=derived_event_id(child.run_id, "answer-parent"))]


def cancel_children(step: Step, conn: Connection, run: RunRecord, reason: str) -> list[Envelope]:
    """Cancel requests for the live children of a run that has ended (they cascade to grandchildren)."""
    return [Envelope.new(EventType.RUN_CANCEL_REQUESTED, child.run_id,
                         RunCancelRequested(reason=f"its parent run {run.run_id} ended: {reason}"),
                         trace_id=step.env.trace_id, causation_id=step.env.event_id,
                         event_id=derived_event_id(child.run_id, "parent-ended"))
            for child in step.rt.store.children(run.run_id, conn) if not is_terminal(child.state)]


def is_delegation(step: Step, req: ToolRequested) -> bool:
    agent = step.rt.agent(req.agent)
    return req.call.name == DELEGATE_TOOL and agent is not None and bool(agent.delegates)


def delegate(step: Step, req: ToolRequested, key: str, arguments: dict[str, Any]) -> ToolResult | list[Envelope]:
    """Start the child run (committed with the step marked delegated), or why it cannot start. The planner
    hands most delegations off itself; a call a policy parked for a person arrives here once approved."""
    store = step.rt.store
    agent = step.rt.agent(req.agent)
    parent = store.get_run(step.env.run_id)
    assert agent is not None
    if parent is None:
        raise AgentfleetError(f"delegation from run {step.env.run_id}, which is not in the store")
    refused = refusal(step, parent, agent, arguments)
    if refused is not None:
        return refused
    goal = child_goal(step, parent, req.iteration, req.call, req.sibling_call_ids, arguments)
    started = step.event(EventType.DELEGATION_STARTED, DelegationStarted(  # the parent may now wait
        agent=parent.agent, iteration=req.iteration, call_id=req.call.id, child_run_id=goal.run_id,
        sibling_call_ids=req.sibling_call_ids), key=(req.iteration, req.call.id, "delegated"))
    with store.tx() as conn:
        store.finish_step(conn, key, status=DELEGATED, output={"child_run_id": goal.run_id}, duration_ms=0.0)
        return step.commit(conn, [goal, started])


def wait_for_children(step: Step, conn: Connection, run: RunRecord, expected: list[str],
                       received: Iterable[str]) -> None:
    """EXECUTING → WAITING_CHILDREN once every call still out is answered by a child run, not a worker."""
    if run.state != RunState.EXECUTING:
        return
    agent = step.rt.agent(run.agent)
    if agent is not None and not agent.delegates:
        return
    outstanding = set(expected) - set(received)
    if outstanding and outstanding <= step.rt.store.delegated_calls(conn, run.run_id, run.iteration):
        moved = step.rt.store.transition(conn, run, RunState.WAITING_CHILDREN)
        step_notices.waiting(step, conn, run, "children", moved)


def on_delegation_started(step: Step) -> list[Envelope]:
    """A call of this run went to a child run: the run waits once nothing else of its iteration runs."""
    started = step.body()
    assert isinstance(started, DelegationStarted)
    store = step.rt.store

    def wait(conn: Connection, run: RunRecord) -> list[Envelope]:
        received = [o["call_id"] for o in store.observations(conn, run.run_id, started.iteration)]
        wait_for_children(step, conn, run, started.sibling_call_ids, received)
        return step.commit(conn, [])

    return step.locked_run(lambda run: run.iteration == started.iteration, wait)
