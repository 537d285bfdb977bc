"""Admission: a goal from the wire becomes a goal.submitted event, or a documented rejection.

Shared by the inbox consumer (any AMQP client) and the CLI, so both refuse the
same goals with the same codes before anything reaches a model.
"""

from __future__ import annotations

import uuid
from typing import Any

from agentfleet.config.agents import AgentRegistry
from agentfleet.errors import ErrorCode, GoalRejected
from agentfleet.events.contracts import Goal, parse_goal
from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted
from agentfleet.loop.decisions import schema_errors
from agentfleet.loop.keys import run_id_for


def admit(agents: AgentRegistry, body: bytes | str | dict[str, Any], routing_key: str | None = None) -> Goal:
    goal = parse_goal(body, routing_key)
    if routing_key and routing_key.startswith("goal.") and routing_key != f"goal.{goal.agent}":
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
    return goal if goal.goal_id else goal.model_copy(update={"goal_id": str(uuid.uuid4())})


def goal_event(goal: Goal, *, reply_to: str | None = None, correlation_id: str | None = None,
               trace_id: str | None = None) -> Envelope:
    assert goal.goal_id, "admit() assigns a goal_id"
    run_id = run_id_for(goal.agent, goal.goal_id)
    payload = GoalSubmitted(agent=goal.agent, goal_id=goal.goal_id, input=goal.input,
                            limits=goal.limits.requested(), reply_to=reply_to, correlation_id=correlation_id)
    # A fresh event id per copy: a second copy is a distinct message (its reply_to counts);
    # the run id, derived from goal_id, is what makes the goal idempotent.
    return Envelope.new(EventType.GOAL_SUBMITTED, run_id, payload, trace_id=trace_id or uuid.uuid4().hex)
