"""Whether a tool may be dispatched now, and what the model is offered: pure decisions.

The facts come from Redis (``health_cache``, ``breaker``); the decisions here take
them as data, so the planner's filter and the executor's refusal are one rule.
A missing health entry is *unknown* and counts as healthy: Redis being away, or a
tool without a check, must never take tools away from the fleet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agentfleet.config.settings import Settings
    from agentfleet.fleet.fleet_redis import FleetRedis

HealthStatus = Literal["healthy", "down"]
BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class HealthEntry:
    """A check's answer as the fleet caches it."""

    status: HealthStatus
    detail: str | None
    checked_at: float  # epoch seconds
    checked_by: str

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: str | None) -> HealthEntry | None:
        """An entry, or None for a missing or unreadable one (unknown: treated as healthy)."""
        data = _json_object(raw)
        if data is None or data.get("status") not in ("healthy", "down"):
            return None
        checked_at, detail, by = _number(data.get("checked_at")), data.get("detail"), data.get("checked_by")
        if checked_at is None or not isinstance(detail, str | None) or not isinstance(by, str):
            return None
        return cls(data["status"], detail, checked_at, by)


@dataclass(frozen=True)
class BreakerEntry:
    """A breaker that is not closed (a closed breaker has no entry)."""

    state: Literal["open", "half_open"]
    since: float  # epoch seconds of the last transition
    failures: int

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: str | None) -> BreakerEntry | None:
        data = _json_object(raw)
        if data is None or data.get("state") not in ("open", "half_open"):
            return None
        since, failures = _number(data.get("since")), data.get("failures")
        if since is None or isinstance(failures, bool) or not isinstance(failures, int) or not 0 <= failures < 2**31:
            return None
        return cls(data["state"], since, failures)


HEALTH_CHECK_FAILED = "its health check failed"


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str | None = None  # why not, in words for the model
    trial_due: bool = False  # the breaker has cooled down: the next call admitted is its one trial
    breaker: BreakerState = "closed"

    @classmethod
    def of(cls, health: HealthEntry | None, breaker: BreakerEntry | None, now: float,
           cooldown_s: float) -> Availability:
        state: BreakerState = breaker.state if breaker else "closed"
        if health is not None and health.status == "down":
            # A fixed sentence: what the check printed is the tool's own text (a channel into the prompt);
            # operators read it in `agentfleet tools`.
            return cls(False, HEALTH_CHECK_FAILED, breaker=state)
        if breaker is None:
            return cls(True)
        if breaker.state == "open" and now < breaker.since + cooldown_s:
            wait = breaker.since + cooldown_s - now
            return cls(False, f"it failed {breaker.failures} times recently (circuit open; retry in {wait:.0f}s)",
                       breaker=state)
        return cls(True, trial_due=True, breaker=state)


UNKNOWN = Availability(True)


@dataclass(frozen=True)
class Transition:
    """A change the fleet announces as ``tool.health_changed``."""

    tool: str
    kind: Literal["check", "breaker"]
    status: str  # check: healthy | down; breaker: open | half_open | closed
    detail: str | None
    at: float
    by: str


def check_transition(tool: str, previous: str | None, entry: HealthEntry) -> Transition | None:
    """A check's answer is news when it differs from the last one (unknown → healthy is not)."""
    if previous == entry.status or (previous is None and entry.status == "healthy"):
        return None
    return Transition(tool, "check", entry.status, entry.detail, entry.checked_at, entry.checked_by)


@dataclass
class FleetFacts:
    """What keeps a fleet-wide fact in Redis needs: the fleet's Redis, the settings, this process's name for
    what it writes, and where its transitions are announced."""

    redis: FleetRedis
    settings: Settings
    by: str
    report: Callable[[Transition], None]


@dataclass(frozen=True)
class Offer:
    """The tools offered to the model this iteration, and the one line that says what is missing."""

    tools: list[str]
    notice: str | None = None


def offer(tools: Sequence[tuple[str, str | None]], availability: Mapping[str, Availability]) -> Offer:
    """Filter ``(name, fallback)`` pairs by health, in declaration order.

    A tool named as another's fallback is held in reserve and offered in that tool's place
    while it is down; a down tool without an available fallback is left out, and the notice
    says why, so the model neither calls it nor wonders where it went.
    """
    reserve = {fallback for _, fallback in tools if fallback}
    offered: list[str] = []
    missing: list[str] = []
    for name, fallback in tools:
        if name in reserve:
            continue
        here = availability.get(name, UNKNOWN)
        if here.available:
            offered.append(name)
            continue
        if fallback and availability.get(fallback, UNKNOWN).available:
            if fallback not in offered:
                offered.append(fallback)
            missing.append(f"{name} ({here.reason}; use {fallback} instead)")
        else:
            missing.append(f"{name} ({here.reason}" + (f"; its fallback {fallback} is unavailable too)"
                                                        if fallback else ")"))
    notice = "Tools unavailable now: " + "; ".join(missing) + "." if missing else None
    return Offer(offered, notice)


MAX_ENTRY_CHARS = 4096  # an entry the fleet writes is a few hundred characters


def _json_object(raw: str | None) -> dict[str, Any] | None:
    """A JSON object, or None for anything else: Redis entries are input (a tool may have written them)."""
    if not raw or len(raw) > MAX_ENTRY_CHARS:
        return None
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _number(value: Any) -> float | None:
    """A finite epoch time, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0 <= number < 1e11 else None  # finite, and before the year 5138
