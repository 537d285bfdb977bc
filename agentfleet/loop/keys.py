"""Deterministic identities: run ids from goals, step keys from steps, event ids from causes."""

from __future__ import annotations

import hashlib
import uuid

# Deterministic ids: run ids derive from (agent, goal_id), event ids from their cause.
ID_NAMESPACE = uuid.UUID("5b2f3c1e-8d4a-4e7b-9a61-0c3f2d9e7a10")


def run_id_for(agent: str, goal_id: str) -> str:
    """Same (agent, goal_id) → same run: the client's goal_id is its idempotency key."""
    return str(uuid.uuid5(ID_NAMESPACE, f"run/{agent}/{goal_id}"))


def idempotency_key(run_id: str, iteration: int, kind: str, call_id: str = "") -> str:
    """The key of one step, unique in the store and handed to tools for outside systems."""
    raw = f"{run_id}|{iteration}|{kind}|{call_id}".encode()
    return hashlib.sha256(raw).hexdigest()[:40]


def derived_event_id(cause_event_id: str, *parts: object) -> str:
    """An event's id derived from the event that caused it, so a re-run publishes the same ids."""
    return str(uuid.uuid5(ID_NAMESPACE, "/".join([cause_event_id, *map(str, parts)])))


def child_goal_id(parent_run_id: str, call_id: str) -> str:
    """A delegation's child goal id, from the parent's run and call: a redelivered delegation names the same
    child run, so it starts no second one."""
    return f"{DELEGATION_PREFIX}{parent_run_id}/{call_id}"


DELEGATION_PREFIX = "delegation/"  # a delegated run's goal id starts so
TRIGGER_PREFIX = "trigger/"  # a triggered run's goal id starts so
# The fleet derives the goal ids under these itself; a goal from outside may not use them.
RESERVED_GOAL_PREFIXES = (DELEGATION_PREFIX, TRIGGER_PREFIX)


def parent_of(goal_id: str | None) -> tuple[str, str] | None:
    """The parent's run and call a delegated run's goal id names (``child_goal_id`` read back), else None."""
    if not goal_id or not goal_id.startswith(DELEGATION_PREFIX):
        return None
    run_id, _, call_id = goal_id[len(DELEGATION_PREFIX):].partition("/")
    return (run_id, call_id) if run_id and call_id else None
