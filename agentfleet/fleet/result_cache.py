"""Results of read-only tools, reused fleet-wide for a while.

The key is the tool's name and its validated arguments in canonical JSON (defaults
filled in, keys sorted), so ``{}`` and ``{"path": "."}`` are one entry when ``.`` is
the default. Values are sealed (``FleetRedis.seal``): a result a tool forged in Redis
is a miss, never a tool's output. A hit is marked on the result (``cache_hit``) and so in the step's
checkpoint: replay and audit say that no tool ran.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pydantic_core import to_jsonable_python
from redis import Redis

from agentfleet import constants as C
from agentfleet.fleet.fleet_redis import FleetRedis


def canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(to_jsonable_python(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


log = logging.getLogger(__name__)
T = TypeVar("T")
PENDING_WRITES = 1000  # results waiting to be stored; beyond that a result is simply not cached
WRITE_BATCH_S = 0.05  # how long the writer gathers writes after a first one: a cached result is seen this much later
WRITES_WITH_A_READ = 16  # a call's read carries at most this many (a result may be large); the writer sends the rest


class ResultCache:
    """Reads on the caller's thread (with the tool's health, in the dispatcher's one round trip); writes
    (results, hit counts) off the call's path: the Result goes out without waiting for Redis, and a write lost to
    a crash only costs a later miss.

    A write waits for the process's next read (``read_with_writes``: it goes first, in the read's round trip), or
    for ``WRITE_BATCH_S``, when a thread of the cache's own sends what is still waiting, together. Each write used
    to wake that thread and wait on Redis alone: two context switches, about 0.1 ms of CPU each on this project's
    two-core VMs (benchmarks/README.md), for every read-only call."""

    def __init__(self, redis: FleetRedis) -> None:
        self.redis = redis
        self._pending: list[Callable[[Redis], object]] = []
        self._due = threading.Event()  # set by the first write of a batch
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

    def read_with_writes(self, r: Redis, read: Callable[[Redis], T]) -> T:
        """``read``'s answer, in one round trip with the writes waiting, sent before it (this process then reads
        its own writes). A write Redis refuses costs itself only; a refused read raises, as alone."""
        writes = self._take(WRITES_WITH_A_READ)
        if not writes:
            return read(r)
        answer = _pipelined(r, writes, read)
        if isinstance(answer, Exception):
            raise answer
        return cast(T, answer)

    def _later(self, write: Callable[[Redis], object]) -> None:
        self._start_writer()
        with self._lock:
            if len(self._pending) >= PENDING_WRITES:
                log.debug("result cache writes are behind; one is dropped")
                return
            self._pending.append(write)
            first = len(self._pending) == 1
        if first:
            self._due.set()

    def _take(self, most: int = PENDING_WRITES) -> list[Callable[[Redis], object]]:
        """Up to ``most`` of the writes waiting, oldest first; none that a parent process left (they are its to
        send, and a prefork child's copy of its list would send them twice)."""
        with self._lock:
            if self._writer_pid != os.getpid():
                return []
            writes, self._pending = self._pending[:most], self._pending[most:]
        return writes

    def _start_writer(self) -> None:
        if self._writer_pid == os.getpid():
            return
        with self._lock:  # once per process: a prefork child does not inherit its parent's thread
            if self._writer_pid != os.getpid():
                self._pending, self._due = [], threading.Event()
                self._writer = threading.Thread(target=self._write_loop, name="agentfleet-cache", daemon=True)
                self._writer.start()
                self._writer_pid = os.getpid()

    def _write_loop(self) -> None:
        """Send what no read took within ``WRITE_BATCH_S`` of a batch's first write, in one pipelined round trip.
        Writes made while it sleeps wake nobody. The thread never ends: a refused write costs itself only."""
        while True:
            self._due.wait()
            self._due.clear()
            time.sleep(WRITE_BATCH_S)
            writes = self._take()
            if not writes:
                continue  # a read took them
            try:
                self.redis.fail_open(functools.partial(_pipelined, writes=writes), None)
            except Exception as exc:  # not Redis being away (fail_open's): a bug, or a pipeline refused whole
                log.warning("result cache writes dropped: %s", exc)


def _pipelined(r: Redis, writes: list[Callable[[Redis], object]], read: Callable[[Redis], object] | None = None
               ) -> object:
    """The writes, then ``read`` if any, in one round trip; ``read``'s answer (its error, if refused). A refused write
    is logged and costs itself only."""
    pipe = r.pipeline(transaction=False)
    for write in writes:
        write(pipe)
    if read is not None:
        read(pipe)
    replies = pipe.execute(raise_on_error=False)
    written = replies[:len(writes)]
    refused = [reply for reply in written if isinstance(reply, Exception)]
    if refused:
        log.info("result cache writes refused by Redis", extra={"refused": len(refused), "first": str(refused[0])})
    return replies[-1] if read is not None else None
