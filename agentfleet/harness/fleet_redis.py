"""The fleet's Redis, with what an outage means decided once.

Redis holds facts the fleet can work without: health entries, breakers and cached
results fail open (a tool is *unknown*, so offered), resource locks fail closed.
Every caller goes through ``FleetRedis.attempt``, which logs an outage once when it
starts and once when it ends (not once per call), and while Redis is away skips it
for ``REDIS_RETRY_S`` at a time, so a call pays no connect timeout per tool.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import LockError, RedisError
from redis.retry import Retry

from agentfleet import constants as C
from agentfleet.config.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
# Anything Redis answers with but a value (unreachable, loading, read-only replica, out of memory)
# is an outage to fail open or closed on; a lock not ours to release is the lock's business.
OUTAGE_ERRORS = (RedisError, OSError)


def connect(settings: Settings) -> redis.Redis:
    """The fleet's Redis: the configured server, or an in-process one (fakeredis) in embedded mode.

    Embedded mode gets a server of its own per runtime, so two fleets in one process (tests)
    never see each other's health or cache.
    """
    if settings.embedded:
        import fakeredis

        return fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    return redis.Redis.from_url(
        settings.redis_url, decode_responses=True, socket_timeout=C.REDIS_SOCKET_TIMEOUT_S,
        socket_connect_timeout=C.REDIS_SOCKET_TIMEOUT_S, health_check_interval=30, retry=no_retry(),
    )


def no_retry() -> Retry:
    """redis-py retries a failed command with backoff (seconds per call); an outage is ours to handle, once."""
    return Retry(NoBackoff(), 0)


class RedisUnavailable(Exception):
    """Redis could not be reached now (raised to callers that must fail closed)."""


class FleetRedis:
    def __init__(self, client: redis.Redis, namespace: str, *, retry_s: float = C.REDIS_RETRY_S) -> None:
        self.client = client
        self.namespace = namespace
        self.retry_s = retry_s
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def key(self, kind: str, *parts: str) -> str:
        return C.redis_key(self.namespace, kind, *parts)

    def forget_namespace(self) -> int:
        """Delete every key of the namespace (health, breakers, cache, locks); how many there were."""
        keys = list(self.client.scan_iter(C.redis_key(self.namespace, "*"), count=1000))
        if keys:
            self.client.delete(*keys)
        return len(keys)

    @property
    def available(self) -> bool:
        """False while an outage is known (no round trip)."""
        return self._down_since is None

    def attempt(self, op: Callable[[redis.Redis], T]) -> T:
        """Run ``op`` against Redis, or raise RedisUnavailable at once while an outage lasts."""
        if self._down_since is not None and time.monotonic() < self._retry_at:
            raise RedisUnavailable("Redis is unreachable")
        try:
            value = op(self.client)
        except LockError:
            raise
        except OUTAGE_ERRORS as exc:
            self._outage(exc)
            raise RedisUnavailable(f"Redis is unreachable: {exc}") from exc
        if self._down_since is not None:
            self._recovered()
        return value

    def fail_open(self, op: Callable[[redis.Redis], T], default: T) -> T:
        """``op``'s value, or ``default`` while Redis is away (health, breakers, cache)."""
        try:
            return self.attempt(op)
        except RedisUnavailable:
            return default

    def _outage(self, exc: BaseException) -> None:
        with self._lock:
            self._retry_at = time.monotonic() + self.retry_s
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("Redis unreachable (%s): tools count as healthy, breakers and the result cache are "
                            "skipped, tools that declare a lock refuse to run until it is back", exc)

    def _recovered(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            lasted = time.monotonic() - self._down_since
            self._down_since = None
            log.warning("Redis is back after %.1fs: health gates, breakers, cache and locks resume", lasted)
