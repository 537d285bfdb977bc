"""Admission: a goal from the wire becomes a goal.submitted event, or a documented rejection.

Shared by the inbox consumer (any AMQP client), the CLI and the embedded fleet, so all
refuse the same goals with the same codes before anything reaches a model. It checks
everything a later step will require, with the models those steps use: a goal it admits
either runs or ends with a Result, never a silent dead letter.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import ValidationError

from agentfleet.agents.registry import AgentRegistry
from agentfleet.constants import GOAL_ROUTING_PREFIX, MAX_JSON_DEPTH
from agentfleet.errors import ErrorCode, GoalRejected
from agentfleet.events.contracts import Goal, parse_goal
from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted
from agentfleet.loop.decisions import schema_errors
from agentfleet.loop.keys import run_id_for
from agentfleet.store.records import RunRecord


def admit(agents: AgentRegistry, body: bytes | str | dict[str, Any], routing_key: str | None = None, *,
          max_depth: int = MAX_JSON_DEPTH, encoding: str | None = None) -> Goal:
    goal = parse_goal(body, routing_key, max_depth=max_depth, encoding=encoding)
    if routing_key is not None and routing_key != f"{GOAL_ROUTING_PREFIX}{goal.agent}":
        raise GoalRejected(f"routing key {routing_key!r} does not match agent {goal.agent!r}",
                           code=ErrorCode.MALFORMED_MESSAGE)
    agent = agents.get(goal.agent)
    if agent is None:
        known = ", ".join(agents.names()) or "(none)"
        raise GoalRejected(f"unknown agent {goal.agent!r}; known: {known}", code=ErrorCode.UNKNOWN_AGENT)
    problems = schema_errors(agent.goal_schema, goal.input)
    if problems:
        raise GoalRejected(f"input breaks the goal schema of {goal.agent!r}: {'; '.join(problems)}",
                           code=ErrorCode.INPUT_INVALID)
    try:  # exactly what the planner will do with them
        agent.limits.tightened_by(goal.limits.requested())
    except ValidationError as exc:
        raise GoalRejected(f"limits out of range: {exc.errors()[0]['msg']}", code=ErrorCode.MALFORMED_MESSAGE) from None
    return goal if goal.goal_id else goal.model_copy(update={"goal_id": str(uuid.uuid4())})


def check_conflict(goal_id: str | None, input: dict[str, Any], existing: RunRecord | None) -> None:
    """A goal_id names one goal: the same id with another input is refused, not answered with the first's Result."""
    if existing is not None and existing.input != input:
        raise GoalRejected(
            f"goal_id {goal_id!r} already names run {existing.run_id} of {existing.agent!r}, "
            "which was started with a different input", code=ErrorCode.GOAL_CONFLICT)


def goal_event(goal: Goal, *, reply_to: str | None = None, correlation_id: str | None = None,
               trace_id: str | None = None) -> Envelope:
    assert goal.goal_id, "admit() assigns a goal_id"
    run_id = run_id_for(goal.agent, goal.goal_id)
    payload = GoalSubmitted(agent=goal.agent, goal_id=goal.goal_id, input=goal.input,
                            limits=goal.limits.requested(), reply_to=reply_to, correlation_id=correlation_id,
                            progress=goal.progress, thread_id=goal.thread_id)
    # A fresh event id per copy: a second copy is a distinct message (its reply_to counts);
    # the run id, derived from goal_id, is what makes the goal idempotent.
    return Envelope.new(EventType.GOAL_SUBMITTED, run_id, payload, trace_id=trace_id or uuid.uuid4().hex)
