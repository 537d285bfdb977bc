"""The fleet's Redis, with what an outage means decided once.

Redis holds facts the fleet can work without: health entries, breakers and cached
results fail open (a tool is *unknown*, so offered), resource locks fail closed.
Every caller goes through ``FleetRedis.attempt``, which logs an outage once when it
starts and once when it ends (not once per call), and while Redis is away skips it
for ``REDIS_RETRY_S`` at a time, so a call pays no connect timeout per tool.

Redis is reachable by tools that may use the network, so what the fleet reads back
and acts on (health entries, breakers, cached results, stop marks) is *sealed*: an
HMAC under the fleet's key, bound to the key name it was written under. A value a
tool wrote, or copied from another key, does not unseal and reads as missing
(unknown), never as fleet state.
"""

from __future__ import annotations

import hashlib
import hmac
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

REDIS_RETRY_S = 1.0  # while Redis is unreachable, how long to skip it before trying again
REDIS_SOCKET_TIMEOUT_S = 0.5


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
        settings.redis_url, decode_responses=True, socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S, health_check_interval=30, retry=no_retry(),
    )


def no_retry() -> Retry:
    """redis-py retries a failed command with backoff (seconds per call); an outage is ours to handle, once."""
    return Retry(NoBackoff(), 0)


def forget_namespace(client: redis.Redis, namespace: str) -> int:
    """Delete every key of a namespace (health, breakers, cache, locks); how many there were."""
    keys = list(client.scan_iter(C.redis_key(namespace, "*"), count=1000))
    if keys:
        client.delete(*keys)
    return len(keys)


class RedisUnavailable(Exception):
    """Redis could not be reached now (raised to callers that must fail closed)."""


SEAL_HEX = 32  # 128 bits of HMAC-SHA256: a forger has no key to try guesses against offline


class FleetRedis:
    def __init__(self, client: redis.Redis, namespace: str, *, secret: bytes | Callable[[], bytes],
                 retry_s: float = REDIS_RETRY_S) -> None:
        """``secret``: the key, or how to get it at first use (from the database: not before a prefork worker
        has forked, or its children would share the parent's connection)."""
        self.client = client
        self.namespace = namespace
        self._secret: bytes | None = secret if isinstance(secret, bytes) else None
        self._get_secret = None if isinstance(secret, bytes) else secret
        self.retry_s = retry_s
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def key(self, kind: str, *parts: str) -> str:
        return C.redis_key(self.namespace, kind, *parts)

    def seal(self, key: str, value: str) -> str:
        """``value`` as stored under ``key``: its MAC (over the key name and the value), a dot, the value.
        Deterministic, so a value read back and sealed again compares equal (the breaker's compare-and-set)."""
        return f"{self._mac(key, value)}.{value}"

    def unseal(self, key: str, raw: str | bytes | None) -> str | None:
        """The value a fleet process sealed under ``key``, or None (missing, foreign, forged or moved)."""
        if raw is None:
            return None
        if isinstance(raw, bytes):
            try:
                raw = raw.decode()
            except UnicodeDecodeError:
                return None
        mac, dot, value = raw.partition(".")
        if not dot or len(mac) != SEAL_HEX or not hmac.compare_digest(mac, self._mac(key, value)):
            return None
        return value

    def _mac(self, key: str, value: str) -> str:
        return hmac.new(self._key(), f"{key}\n{value}".encode(errors="surrogatepass"),
                        hashlib.sha256).hexdigest()[:SEAL_HEX]

    def _key(self) -> bytes:
        if self._secret is None:
            assert self._get_secret is not None
            secret = self._get_secret()
            if not secret:
                raise ValueError("the fleet's Redis needs a key to seal what it writes")
            self._secret = secret
        return self._secret


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
