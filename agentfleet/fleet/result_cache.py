"""Results of read-only tools, reused fleet-wide for a while.

The key is the tool's name and its validated arguments in canonical JSON (defaults
filled in, keys sorted), so ``{}`` and ``{"path": "."}`` are one entry when ``.`` is
the default. Values are sealed (``FleetRedis.seal``): a result a tool forged in Redis
is a miss, never a tool's output. A hit is marked on the result (``cache_hit``) and so in the step's
checkpoint: replay and audit say that no tool ran.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from pydantic_core import to_jsonable_python
from redis import Redis

from agentfleet import constants as C
from agentfleet.fleet.fleet_redis import FleetRedis


def canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(to_jsonable_python(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


log = logging.getLogger(__name__)
PENDING_WRITES = 1000  # results waiting to be stored; beyond that a result is simply not cached


class ResultCache:
    """Reads on the caller's thread (with the tool's health, in the dispatcher's one round trip); writes
    (results, hit counts) on a thread of its own, off the call's path: the Result goes out without waiting
    for Redis, and a write lost to a crash only costs a later miss."""

    def __init__(self, redis: FleetRedis) -> None:
        self.redis = redis
        self._writes: queue.Queue[Callable[[Redis], object]] = queue.Queue(PENDING_WRITES)
        self._writer: threading.Thread | None = None
        self._writer_pid = 0
        self._lock = threading.Lock()

    def key(self, tool: str, arguments: dict[str, Any]) -> str:
        digest = hashlib.sha256(canonical(arguments).encode()).hexdigest()
        return self.redis.key(C.CACHE_KEY, tool, digest)

    def decode(self, tool: str, value: str | None) -> tuple[bool, Any]:
        """``(hit, output)`` from a stored value, unsealed by the dispatcher, which reads it with the tool's
        health in one round trip (a value no fleet process sealed under this key arrives as None); a hit is
        counted."""
        if value is None:
            return False, None
        try:
            output = json.loads(value)
        except ValueError:
            return False, None
        hits = self.redis.key(C.CACHE_HITS_KEY, tool)
        self._later(lambda r: r.incr(hits))
        return True, output

    def put(self, key: str, output: Any, ttl_s: float) -> None:
        """Store a result in the background."""
        encoded, ttl_ms = self.redis.seal(key, json.dumps(output)), int(ttl_s * 1000)
        self._later(lambda r: r.set(key, encoded, px=ttl_ms))

    def _later(self, write: Callable[[Redis], object]) -> None:
        self._start_writer()
        try:
            self._writes.put_nowait(write)
        except queue.Full:
            log.debug("result cache writes are behind; one is dropped")

    def _start_writer(self) -> None:
        if self._writer_pid == os.getpid():
            return
        with self._lock:  # once per process: a prefork child does not inherit its parent's thread
            if self._writer_pid != os.getpid():
                self._writes = queue.Queue(PENDING_WRITES)
                self._writer = threading.Thread(target=self._write_loop, name="agentfleet-cache", daemon=True)
                self._writer.start()
                self._writer_pid = os.getpid()

    def _write_loop(self) -> None:
        while True:
            self.redis.fail_open(self._writes.get(), None)
