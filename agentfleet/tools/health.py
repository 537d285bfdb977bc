"""Declaring a tool's health check (``harness/checks.py`` runs one within its timeout).

A check is a plain function (returns nothing or a detail string, raises when the
tool cannot work) or a command line for runtime checks (``["node", "--version"]``).
Tools that depend on the same thing share one check by name, so it runs once for
all of them. Where and how often checks run, and what the fleet does with their
answers, is ``health_cache``'s business.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agentfleet.errors import ConfigurationError

# Timeout tiers (seconds): what a tool or health check may take by the kind of thing it calls.
TIER_TIMEOUTS_S = {"model": 30.0, "database": 5.0, "http": 3.0, "local": 1.0}


Tier = Literal["model", "database", "http", "local"]
TIERS: tuple[str, ...] = tuple(TIER_TIMEOUTS_S)


@dataclass(frozen=True)
class HealthCheck:
    """A named check. ``ttl_s`` / ``down_ttl_s`` override how long its answer counts fleet-wide."""

    name: str
    target: Callable[[], object] | tuple[str, ...]
    tier: Tier = "local"
    timeout_s: float | None = None
    ttl_s: float | None = None
    down_ttl_s: float | None = None

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ConfigurationError(f"health check {self.name!r}: tier must be one of {', '.join(TIERS)}")
        if isinstance(self.target, tuple) and (not self.target or not all(isinstance(a, str) for a in self.target)):
            raise ConfigurationError(f"health check {self.name!r}: a command is a non-empty list of strings")
        for what in ("timeout_s", "ttl_s", "down_ttl_s"):
            value = getattr(self, what)
            if value is not None and value <= 0:
                raise ConfigurationError(f"health check {self.name!r}: {what} must be positive")


_named: dict[str, HealthCheck] = {}
_named_lock = threading.Lock()


def health_check(
    name: str,
    target: Callable[[], object] | Sequence[str],
    *,
    tier: Tier = "local",
    timeout_s: float | None = None,
    ttl_s: float | None = None,
    down_ttl_s: float | None = None,
) -> HealthCheck:
    """Declare a check that several tools share: ``@tool(health_check="node")`` then names it."""
    check = HealthCheck(name, target if callable(target) else tuple(target), tier, timeout_s, ttl_s, down_ttl_s)
    with _named_lock:
        existing = _named.get(name)
        if existing is not None and existing != check:
            raise ConfigurationError(f"health check {name!r} is declared twice, differently")
        _named[name] = check
    return check


def as_health_check(spec: object, tool_name: str, tier: Tier) -> HealthCheck | None:
    """What ``@tool(health_check=...)`` was given, as a check: a name, a check, a function or a command."""
    if spec is None or isinstance(spec, HealthCheck):
        return spec
    if isinstance(spec, str):
        check = _named.get(spec)
        if check is None:
            raise ConfigurationError(f"tool {tool_name!r}: no health check named {spec!r} (declare it first with "
                                     "health_check(name, ...))")
        return check
    if callable(spec):
        return HealthCheck(tool_name, spec, tier)
    if isinstance(spec, list | tuple):
        return HealthCheck(tool_name, tuple(spec), tier)
    raise ConfigurationError(f"tool {tool_name!r}: health_check must be a function, a command (list of strings), "
                             "a HealthCheck or a check's name")
