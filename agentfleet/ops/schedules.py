"""Schedules as operators and applications manage them: add, list, pause, resume, delete."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agentfleet.errors import ConfigurationError
from agentfleet.events.contracts import Goal
from agentfleet.loop.ticks import CatchUp, Spec, next_after
from agentfleet.roles.schedules import spec_of
from agentfleet.store.records import now
from agentfleet.store.repository import Store

SCHEDULE_ID_CHARS = 100


def add_schedule(store: Store, schedule_id: str, agent: str, input: dict[str, Any], *, cron: str | None = None,
                 every_s: float | None = None, timezone: str = "UTC", jitter_s: float = 0.0,
                 catch_up: CatchUp = "latest", limits: dict[str, Any] | None = None,
                 thread_id: str | None = None, paused: bool = False) -> dict[str, Any]:
    """A new schedule of goals for ``agent``; its first tick is the first after now."""
    if not schedule_id or len(schedule_id) > SCHEDULE_ID_CHARS or not schedule_id.replace("-", "").replace(
            "_", "").replace(".", "").isalnum():
        raise ConfigurationError(f"schedule name {schedule_id!r}: up to {SCHEDULE_ID_CHARS} letters, digits, '-', "
                                 "'_' or '.'")
    Goal.model_validate({"agent": agent, "input": input, "limits": limits or {}, "thread_id": thread_id})
    at = now().replace(microsecond=0)
    spec = Spec(cron=cron, every_s=every_s, timezone=timezone, jitter_s=jitter_s, catch_up=catch_up,
                anchor=at).check()
    return store.add_schedule({"schedule_id": schedule_id, "agent": agent, "input": input, "limits": limits or {},
                               "thread_id": thread_id, "cron": cron, "every_s": every_s, "timezone": timezone,
                               "jitter_s": jitter_s, "catch_up": catch_up, "anchor": at, "paused": paused,
                               "next_at": next_after(spec, at)})


def pause_schedule(store: Store, schedule_id: str) -> dict[str, Any]:
    """Fire nothing until resumed (ticks meanwhile are not caught up)."""
    return _set(store, schedule_id, paused=True)


def resume_schedule(store: Store, schedule_id: str) -> dict[str, Any]:
    """Fire again from the first tick after now."""
    found = _get(store, schedule_id)
    return _set(store, schedule_id, paused=False, next_at=next_after(spec_of(found), now()))


def delete_schedule(store: Store, schedule_id: str) -> None:
    if not store.delete_schedule(schedule_id):
        raise ConfigurationError(f"no schedule named {schedule_id!r}")


def describe(row: dict[str, Any]) -> dict[str, Any]:
    """A schedule as ``schedule list`` shows it."""
    when = row["cron"] if row["cron"] else f"every {row['every_s']:g}s"
    return {"schedule": row["schedule_id"], "agent": row["agent"], "when": when, "timezone": row["timezone"],
            "jitter_s": row["jitter_s"], "catch_up": row["catch_up"], "paused": row["paused"],
            "next_at": _iso(row["next_at"]), "fired": row["fired"], "skipped": row["skipped"],
            "last_fired_at": _iso(row["last_fired_at"]), "last_goal_id": row["last_goal_id"],
            "thread_id": row["thread_id"], "input": row["input"]}


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat(timespec="seconds") if at else None


def _get(store: Store, schedule_id: str) -> dict[str, Any]:
    found = store.schedule(schedule_id)
    if found is None:
        raise ConfigurationError(f"no schedule named {schedule_id!r}")
    return found


def _set(store: Store, schedule_id: str, **values: Any) -> dict[str, Any]:
    if not store.set_schedule(schedule_id, **values):
        raise ConfigurationError(f"no schedule named {schedule_id!r}")
    return _get(store, schedule_id)
