"""When a schedule's goals are due: cron expressions in a time zone, or fixed intervals; jitter; catching up
after downtime. Pure: times in, times out. Every scheduler computes the same ticks for the same schedule, so
whichever fires one fires the same one, under the same goal id.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from agentfleet.errors import ConfigurationError

CatchUp = Literal["all", "latest", "none"]
CATCH_UPS: tuple[CatchUp, ...] = ("all", "latest", "none")
MAX_CATCH_UP = 100  # ticks one pass fires at most for a schedule ("all" after a long downtime goes on next pass)
ON_TIME_S = 60.0  # "none": a tick this late still fires (a scheduler's poll, a restart); later ones are skipped


@dataclass(frozen=True)
class Spec:
    """A schedule's timing: ``cron`` (five fields, in ``timezone``) or ``every_s`` from ``anchor``; ``jitter_s``
    delays each tick by a fixed share of it (the same for every scheduler); ``catch_up`` decides what ticks
    missed while no scheduler ran do: ``all`` fire, ``latest`` only the last fires, ``none`` none fires."""

    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    jitter_s: float = 0.0
    catch_up: CatchUp = "latest"
    anchor: datetime = datetime(2000, 1, 1, tzinfo=UTC)

    def check(self) -> Spec:
        if (self.cron is None) == (self.every_s is None):
            raise ConfigurationError("a schedule has either a cron expression or an interval, not both or neither")
        if self.every_s is not None and not (math.isfinite(self.every_s) and self.every_s >= 1):
            raise ConfigurationError("a schedule's interval is at least 1 s")
        if not (math.isfinite(self.jitter_s) and self.jitter_s >= 0):
            raise ConfigurationError("jitter is a number of seconds, 0 or more")
        if self.catch_up not in CATCH_UPS:
            raise ConfigurationError(f"catch-up is one of {', '.join(CATCH_UPS)}")
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(f"unknown time zone {self.timezone!r} (an IANA name: Europe/Berlin)") from None
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime.now(zone))
            except CronSimError as exc:
                raise ConfigurationError(f"cron expression {self.cron!r}: {exc}") from None
        return self


def next_after(spec: Spec, after: datetime) -> datetime:
    """The schedule's first tick strictly after ``after`` (UTC)."""
    if spec.every_s is not None:
        k = math.floor((after - spec.anchor).total_seconds() / spec.every_s) + 1
        tick = spec.anchor + timedelta(seconds=k * spec.every_s)
        return tick if tick > after else tick + timedelta(seconds=spec.every_s)
    assert spec.cron is not None
    local = after.astimezone(ZoneInfo(spec.timezone))
    return next(iter(CronSim(spec.cron, local))).astimezone(UTC)


def jitter(spec: Spec, schedule_id: str, tick: datetime) -> timedelta:
    """How long after ``tick`` it fires: a share of ``jitter_s`` derived from the schedule and the tick."""
    if spec.jitter_s <= 0:
        return timedelta(0)
    digest = hashlib.blake2b(f"{schedule_id}/{tick.isoformat()}".encode(), digest_size=8).digest()
    return timedelta(seconds=spec.jitter_s * int.from_bytes(digest, "big") / 2 ** 64)


@dataclass(frozen=True)
class Due:
    fire: list[datetime]  # ticks to fire now, oldest first
    skipped: int  # ticks passed over by the catch-up policy
    next_at: datetime  # the next tick not yet fired or passed over


def due(spec: Spec, schedule_id: str, next_at: datetime, now: datetime) -> Due:
    """What a scheduler does at ``now`` with a schedule whose next tick is ``next_at``."""
    passed: list[datetime] = []
    tick = next_at
    while tick + jitter(spec, schedule_id, tick) <= now and len(passed) < MAX_CATCH_UP:
        passed.append(tick)
        tick = next_after(spec, tick)
    if not passed:
        return Due([], 0, next_at)
    if spec.catch_up == "all":
        fire = passed
    elif spec.catch_up == "latest":
        fire = passed[-1:]
    else:
        fire = [t for t in passed if (now - t).total_seconds() <= ON_TIME_S + spec.jitter_s]
    return Due(fire, len(passed) - len(fire), tick)


def goal_id_for(schedule_id: str, tick: datetime) -> str:
    """The goal id of a schedule's tick: firing it again (another scheduler, a retried pass) is the same run."""
    return f"schedule:{schedule_id}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
