"""One thin Celery task per consumed event: decode → the role's handler → publish what it returns."""

from agentfleet.tasks.admission import admit, goal_event
from agentfleet.tasks.catalog import HANDLERS, register_tasks

__all__ = ["HANDLERS", "admit", "goal_event", "register_tasks"]
