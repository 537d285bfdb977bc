"""Schedules on the real fleet: two schedulers (observer workers) fire each tick once; one killed mid-way loses no
tick and doubles none; a paused schedule fires nothing."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta

import pytest

from agentfleet import Client
from agentfleet import constants as C
from agentfleet.config.settings import get_settings
from agentfleet.store import Store
from tests.conftest import WorkerProcs
from tests.helpers import eventually

pytestmark = pytest.mark.integration
EVERY_S = 1
POLL_S = "0.25"  # the schedulers look four times a tick


def fired(store: Store, name: str) -> list[datetime]:
    prefix = f"schedule:{name}:"
    ticks = [r.goal_id[len(prefix):] for r in store.list_runs(agent="single", limit=10_000)
             if r.goal_id.startswith(prefix)]
    return sorted(datetime.fromisoformat(t.replace("Z", "+00:00")) for t in ticks)


def test_two_schedulers_fire_each_tick_once_and_a_killed_one_loses_none(workers: WorkerProcs, namespace: str,
                                                                        store: Store) -> None:
    workers.env["AGENTFLEET_SCHEDULE_POLL_S"] = POLL_S
    for role in (C.PLANNER, C.EXECUTOR, C.OBSERVER, C.OBSERVER):
        workers.start(role)
    workers.wait_ready()
    with Client(get_settings()) as fleet:
        fleet.schedule("beat", "single", {}, every_s=EVERY_S, catch_up="all")
        fleet.schedule("held", "single", {}, every_s=EVERY_S)
        fleet.pause_schedule("held")
        eventually(lambda: len(fired(store, "beat")) >= 4, timeout=30, message="four ticks fired")
        observer = next(name for name, _ in workers.procs if name.startswith(f"{C.OBSERVER}."))
        assert workers.kill(observer)  # one scheduler SIGKILLed, whatever it held
        eventually(lambda: len(fired(store, "beat")) >= 9, timeout=40, message="the other goes on")
        fleet.pause_schedule("beat")  # waits for a pass holding the row: after it, no pass fires the schedule
        listed = {s["schedule"]: s for s in fleet.schedules()}
        time.sleep(3 * EVERY_S)  # three ticks' time: a paused schedule fires none of them
        after = {s["schedule"]: s for s in fleet.schedules()}
        eventually(lambda: len(fired(store, "beat")) == listed["beat"]["fired"], timeout=30,
                   message="a run for every goal fired")
        ticks = fired(store, "beat")
    assert after["beat"]["fired"] == listed["beat"]["fired"]
    gaps = {b - a for a, b in itertools.pairwise(ticks)}
    assert gaps == {timedelta(seconds=EVERY_S)}, ticks  # no tick lost, none doubled (one run per goal id)
    assert listed["held"]["paused"] is True
    assert fired(store, "held") == []
