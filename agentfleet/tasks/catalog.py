"""One Celery task per consumed event type: name = routing key = event type."""

from __future__ import annotations

from typing import Any

from celery import Celery

from agentfleet.events.envelope import EventType
from agentfleet.events.topology import CONSUMERS
from agentfleet.tasks import executor, observer, planner
from agentfleet.tasks.base import EventTask, Handler, run_event

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
    EventType.APPROVAL_REQUESTED: observer.on_approval_requested,
    EventType.APPROVAL_RESOLVED: observer.on_approval_resolved,
    EventType.DELEGATION_STARTED: observer.on_delegation_started,
    EventType.DOMAIN_EVENT: observer.on_domain_event,
}
assert set(HANDLERS) == set(CONSUMERS), "every consumed event type has exactly one handler"


def register_tasks(app: Celery) -> None:
    for event_type, handler in HANDLERS.items():

        def task(self: EventTask, envelope: Any, carried: dict[str, Any] | None = None) -> str:
            return run_event(self, envelope, carried)

        task.__name__ = task.__qualname__ = str(event_type).replace(".", "_")
        task.__doc__ = f"Handle {event_type} ({CONSUMERS[event_type]} role)."
        app.task(name=str(event_type), bind=True, base=EventTask, shared=False,
                 handler=staticmethod(handler), role=CONSUMERS[event_type])(task)
