"""Durations and times as operators type them: ``30s``, ``5m``, ``2h``, ``1d``, or an ISO 8601 time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from agentfleet.errors import AgentfleetError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str, *, option: str) -> float:
    """Seconds of ``30s``, ``5m``, ``2h``, ``1d``."""
    match = _DURATION.match(value.strip())
    if not match:
        raise AgentfleetError(f"{option} {value!r}: give a duration (30s, 5m, 2h, 1d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_since(value: str, now: datetime | None = None, *, option: str = "--since") -> datetime:
    """``30m``, ``2h``, ``1d`` ago, or an ISO 8601 time."""
    now = now or datetime.now(UTC)
    if _DURATION.match(value.strip()):
        return now - timedelta(seconds=parse_duration(value, option=option))
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise AgentfleetError(f"{option} {value!r}: give a duration (30m, 2h, 1d) or an ISO 8601 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
