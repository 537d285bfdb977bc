"""The Celery app, role definitions, bootsteps, and the embedded fleet."""

from agentfleet.workers.roles import ROLES, Role, worker_argv

__all__ = ["ROLES", "Role", "worker_argv"]
