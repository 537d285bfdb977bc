"""What each role does with each event: planner, executor, observer, and the paths they share (admission,
delegation, approvals, the sweeper). Handlers take a ``Step`` and return the events it causes; Celery is
``workers/``'s business."""

from agentfleet.roles.admission import admit, goal_event
from agentfleet.roles.catalog import HANDLERS

__all__ = ["HANDLERS", "admit", "goal_event"]
