"""What handles each consumed event type (``workers/event_task.py`` makes one Celery task of each).

Which *queue* an event goes to is the wire's business (``events.topology.CONSUMERS``: the topology binds
queues before any role's code is loaded); what runs when it arrives is this table. They must name the same
event types, checked when this module loads (an ``assert`` would vanish under ``python -O``).
"""

from __future__ import annotations

from agentfleet.errors import ConfigurationError
from agentfleet.events.envelope import EventType
from agentfleet.events.topology import CONSUMERS
from agentfleet.roles import approvals, delegation, executor, observer, planner
from agentfleet.roles.step import Handler

HANDLERS: dict[EventType, Handler] = {
    EventType.GOAL_SUBMITTED: planner.on_goal_submitted,
    EventType.OBSERVATION_RECORDED: planner.on_observation_recorded,
    EventType.TOOL_REQUESTED: executor.on_tool_requested,
    EventType.TOOL_COMPLETED: observer.on_tool_finished,
    EventType.TOOL_FAILED: observer.on_tool_finished,
    EventType.RUN_CANCEL_REQUESTED: observer.on_cancel_requested,
    EventType.RUN_COMPLETED: observer.on_run_ended,
    EventType.RUN_FAILED: observer.on_run_ended,
    EventType.TOOL_HEALTH_CHANGED: observer.on_tool_health_changed,
    EventType.APPROVAL_REQUESTED: approvals.on_approval_requested,
    EventType.APPROVAL_RESOLVED: approvals.on_approval_resolved,
    EventType.DELEGATION_STARTED: delegation.on_delegation_started,
    EventType.DOMAIN_EVENT: observer.on_domain_event,
}
if set(HANDLERS) != set(CONSUMERS):
    raise ConfigurationError(f"every consumed event type needs exactly one handler: without one "
                             f"{sorted(set(CONSUMERS) - set(HANDLERS))}, "
                             f"not consumed {sorted(set(HANDLERS) - set(CONSUMERS))}")
