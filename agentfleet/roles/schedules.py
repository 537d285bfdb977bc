"""The scheduler: observers fire due schedules' goals, each tick once whatever the number of schedulers.

A claim per tick, not a leader: each pass takes the due schedules' rows (``Store.due_schedules``: another
scheduler skips a row one holds), publishes each due tick's goal to the inbox and moves the schedule's next tick
on, in one transaction. Nothing is elected, so nothing fails over: a killed scheduler's rows are let go with its
connection and the next pass of any other fires what it had not committed. A tick published but not committed (a
scheduler killed between the two) is published again, under the same goal id (``loop.ticks.goal_id_for``): the
fleet starts one run for a goal id however often it arrives. Celery beat, by contrast, is a single process, and two
of them fire every tick twice.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from agentfleet.constants import GOAL_ROUTING_PREFIX
from agentfleet.loop.ticks import Spec, due, goal_id_for
from agentfleet.roles.runtime import Runtime
from agentfleet.store.records import now

log = logging.getLogger(__name__)
SCHEDULE_BATCH = 50  # schedules one pass takes at most (the rest on the next)


def spec_of(row: dict[str, Any]) -> Spec:
    return Spec(cron=row["cron"], every_s=row["every_s"], timezone=row["timezone"], jitter_s=row["jitter_s"],
                catch_up=row["catch_up"], anchor=row["anchor"])


def goal_of(row: dict[str, Any], tick: datetime) -> dict[str, Any]:
    """A tick's goal, as any client sends one."""
    body: dict[str, Any] = {"agent": row["agent"], "input": row["input"], "goal_id": goal_id_for(row["schedule_id"],
                                                                                                  tick)}
    if row["limits"]:
        body["limits"] = row["limits"]
    if row["thread_id"]:
        body["thread_id"] = row["thread_id"]
    return body


def fire_due(rt: Runtime, at: datetime | None = None) -> list[dict[str, Any]]:
    """One scheduler pass: each due schedule's ticks fired (as its catch-up policy says) and its next tick set.
    What was fired, per schedule."""
    at = at or now()
    fired: list[dict[str, Any]] = []
    inbox = rt.topology.inbox
    with rt.store.due_schedules(at, SCHEDULE_BATCH) as (conn, rows):
        for row in rows:
            assert conn is not None
            plan = due(spec_of(row), row["schedule_id"], row["next_at"], at)
            if not plan.fire and plan.next_at == row["next_at"]:
                continue  # its jitter has not passed yet
            goals = [goal_of(row, tick) for tick in plan.fire]
            for body in goals:  # before the commit: a commit that fails fires these again, as the same runs
                rt.publisher.publish_json(inbox, f"{GOAL_ROUTING_PREFIX}{body['agent']}", body,
                                          declare=[rt.topology.inbox_queue])
            rt.store.advance(conn, row["schedule_id"], next_at=plan.next_at, fired=len(goals), skipped=plan.skipped,
                             last_goal_id=goals[-1]["goal_id"] if goals else None)
            if plan.skipped:
                log.info("schedule %s: %d missed tick(s) passed over (catch-up %s)", row["schedule_id"],
                         plan.skipped, row["catch_up"])
            fired.append({"schedule_id": row["schedule_id"], "goal_ids": [g["goal_id"] for g in goals],
                          "skipped": plan.skipped, "next_at": plan.next_at})
    return fired
