"""What a worker checks before it consumes anything: a fault it can name is an exit, not a hang or a crash later.

A worker that cannot import its agents, or whose database is behind the code's
migrations, would take messages it can only fail (the first goal died in the
planner with ``relation "processed_events" does not exist``). A worker that cannot
reach the broker, the database or Redis used to print its banner and wait forever.
Both now stop, non-zero, naming what to fix, so a supervisor sees them: a service
is tried for ``AGENTFLEET_CONNECT_TIMEOUT_S`` first (a fleet and its services
often start together), with a log line per try. Once running, a worker rides out
outages without limit; this bound is for the start only, and for CLI commands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentfleet.agents.registry import fleet_agents
from agentfleet.config.settings import Settings
from agentfleet.errors import ConfigurationError, ServiceUnreachable
from agentfleet.hooks.loading import hook_targets
from agentfleet.redaction import redact
from agentfleet.store import db

log = logging.getLogger(__name__)

ATTEMPT_TIMEOUT_S = 5.0  # one connect attempt; a host that drops packets costs this, not the OS's minutes
MAX_PAUSE_S = 5.0


def _broker(url: str, timeout_s: float) -> None:
    from kombu import Connection

    with Connection(url, connect_timeout=timeout_s) as conn:  # one try: the pauses between tries are ours
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, interval_max=0, timeout=timeout_s)


def _database(url: str, timeout_s: float) -> tuple[str | None, str]:
    return db.revisions(url, connect_timeout_s=timeout_s)


def _redis(url: str, timeout_s: float) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    finally:
        client.close()


@dataclass(frozen=True)
class Service:
    """A service the fleet needs, the setting that points at it, and how to knock on its door."""

    name: str
    setting: str
    url: str
    probe: Callable[[str, float], Any]


def services(settings: Settings, *names: str) -> list[Service]:
    """The distributed profile's services (all, or those named); embedded mode has none to reach."""
    if settings.embedded:
        return []
    known = [Service("broker", "AGENTFLEET_BROKER_URL", settings.broker_url, _broker),
             Service("database", "AGENTFLEET_DATABASE_URL", settings.database_url, _database),
             Service("redis", "AGENTFLEET_REDIS_URL", settings.redis_url, _redis)]
    return [s for s in known if not names or s.name in names]


def reach(service: Service, timeout_s: float, *, stop_check: Callable[[], None] | None = None) -> Any:
    """What ``service.probe`` returns, tried with growing pauses until ``timeout_s`` has passed.

    ``stop_check`` runs between tries and raises to abandon them (a worker told to stop
    while it waits must stop: Celery's SIGTERM handler only sets a flag).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return service.probe(service.url, max(0.5, min(ATTEMPT_TIMEOUT_S, deadline - time.monotonic())))
        except Exception as exc:
            detail = f"{type(exc).__name__}: {redact(str(exc)).strip()[:300]}"
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServiceUnreachable(
                    f"cannot reach the {service.name} at {redact(service.url)} ({service.setting}): {detail}; "
                    f"tried {attempt} times in {time.monotonic() - started:.1f}s (AGENTFLEET_CONNECT_TIMEOUT_S)"
                ) from None
            pause = min(0.25 * 2 ** (attempt - 1), MAX_PAUSE_S, left)
            log.warning("%s unreachable at %s (%s): %s; retrying in %.1fs for up to %.0fs more", service.name,
                        redact(service.url), service.setting, detail, pause, left,
                        extra={"service": service.name, "attempt": attempt})
        _pause(pause, stop_check)


def _pause(seconds: float, stop_check: Callable[[], None] | None) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if stop_check is not None:
            stop_check()
        time.sleep(min(left, 0.2))


def reach_all(settings: Settings, *names: str, stop_check: Callable[[], None] | None = None) -> dict[str, Any]:
    """Each named service (all, if none named) reached in turn, by name: what its probe returned."""
    return {s.name: reach(s, settings.connect_timeout_s, stop_check=stop_check) for s in services(settings, *names)}


def preflight(settings: Settings, *, stop_check: Callable[[], None] | None = None) -> None:
    """Raise ConfigurationError or ServiceUnreachable naming what to fix; return when the worker may start."""
    fleet_agents(settings)
    hook_targets(settings.hooks)
    url = settings.effective_database_url
    reached = reach_all(settings, stop_check=stop_check)
    current, head = reached["database"] if "database" in reached else db.revisions(url)
    if current != head:
        raise ConfigurationError(f"the database at {redact(url)} is at migration {current or 'none'}, this code needs "
                                 f"{head}: run `agentfleet db upgrade` (AGENTFLEET_DATABASE_URL), then start again")
