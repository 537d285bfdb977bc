"""Resource locks a tool declares (``@tool(lock="ticket:{ticket_id}")``), held in Redis while a call runs.

redis-py's ``Lock`` gives each holder a token and releases only its own, so a lock
that expired and was taken by another call is never released by the first. Locks
fail closed: without Redis a tool that declares one does not run.

The token is the step's idempotency key. A step runs in one place at a time (its
Postgres advisory lock), so a lock held under the same key belongs to an earlier
attempt of this very step whose worker died mid-call: the new attempt takes it over
instead of waiting out a dead holder's expiry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import LockError
from redis.lock import Lock

from agentfleet import constants as C
from agentfleet.errors import ErrorCode, ToolError
from agentfleet.fleet.fleet_redis import FleetRedis, RedisUnavailable

log = logging.getLogger(__name__)


class StepLock(Lock):
    """A redis-py Lock that its own token may take again (set if absent, or refresh if already ours)."""

    TAKE = """
    if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
    if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
    return 0
    """

    def do_acquire(self, token: str) -> bool:
        if not self.timeout:
            return super().do_acquire(token)
        return bool(self.redis.eval(self.TAKE, 1, self.name, token, int(self.timeout * 1000)))


class HeldLock:
    """A lock being held; ``keep()`` leaves it to expire instead of releasing it."""

    def __init__(self) -> None:
        self.kept = False

    def keep(self) -> None:
        self.kept = True


@contextmanager
def resource_lock(redis: FleetRedis, resource: str, *, owner: str, wait_s: float,
                  hold_s: float) -> Iterator[HeldLock]:
    """Hold ``resource`` for the block, or raise ToolError(TRANSIENT) without running it.

    ``hold_s`` bounds how long a holder that died keeps others out. A call abandoned at its
    timeout may still be running, so its caller keeps the lock until it expires (``keep``).
    """
    lock = StepLock(redis.client, redis.key(C.LOCK_KEY, resource), timeout=hold_s, blocking_timeout=wait_s,
                    thread_local=False)
    try:
        acquired = redis.attempt(lambda _r: lock.acquire(token=owner))
    except RedisUnavailable:
        raise ToolError(f"cannot take the lock on {resource!r}: Redis is unreachable", code=ErrorCode.TRANSIENT,
                        hint="This tool never runs without its lock; try again shortly.") from None
    if not acquired:
        raise ToolError(f"{resource!r} is locked by another call (waited {wait_s:g}s)", code=ErrorCode.TRANSIENT,
                        hint="Another run is changing the same resource; try again shortly.")
    held = HeldLock()
    try:
        yield held
    finally:
        if not held.kept:
            try:
                redis.attempt(lambda _r: lock.release())
            except (LockError, RedisUnavailable) as exc:  # expired (and maybe taken): not ours to release
                log.warning("lock on %s was not released by us: %s", resource, exc)
