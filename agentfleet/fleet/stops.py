"""Telling running tool calls that their run is over: a mark per ended run in Redis, read while a call runs.

A run can end while its tools still run: it was cancelled, it hit its deadline, it
failed. The observer marks such a run once (``mark``); every executor running one
of its calls reads the mark (``stopped``) about every ``CANCEL_POLL_S``, kills a
subprocess tool with everything it started, and turns an in-process tool's
``ctx.cancelled`` true so its next ``heartbeat`` raises. Heartbeats land here too,
for operators to see how far a long call got. If Redis is down, calls run to their
timeout (the mark fails open, like the health gate).
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentfleet import constants as C
from agentfleet.fleet.fleet_redis import FleetRedis

CANCEL_TTL_S = 24 * 3600.0  # a run's cancel mark outlives any tool call it could stop
HEARTBEAT_TTL_S = 600.0


class RunStops:
    def __init__(self, redis: FleetRedis) -> None:
        self.redis = redis

    def mark(self, run_id: str, reason: str) -> None:
        key = self.redis.key(C.CANCEL_KEY, run_id)
        sealed = self.redis.seal(key, reason)
        self.redis.fail_open(lambda r: r.set(key, sealed, ex=int(CANCEL_TTL_S)), None)

    def stopped(self, run_id: str) -> bool:
        """Whether a fleet process marked the run ended (a mark a tool forged does not count)."""
        key = self.redis.key(C.CANCEL_KEY, run_id)
        return self.redis.unseal(key, self.redis.fail_open(lambda r: r.get(key), None)) is not None

    def heartbeat(self, idempotency_key: str, details: Any) -> None:
        key = self.redis.key(C.HEARTBEAT_KEY, idempotency_key)
        value = json.dumps({"at": time.time(), "details": details}, default=str)
        self.redis.fail_open(lambda r: r.set(key, value, ex=int(HEARTBEAT_TTL_S)), None)

    def last_heartbeat(self, idempotency_key: str) -> dict[str, Any] | None:
        key = self.redis.key(C.HEARTBEAT_KEY, idempotency_key)
        raw = self.redis.fail_open(lambda r: r.get(key), None)
        try:
            beat = json.loads(raw) if raw else None
        except ValueError:
            return None  # not the fleet's: a tool can reach Redis
        return beat if isinstance(beat, dict) else None
