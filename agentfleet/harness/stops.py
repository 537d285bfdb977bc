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
from agentfleet.harness.fleet_redis import FleetRedis


class RunStops:
    def __init__(self, redis: FleetRedis) -> None:
        self.redis = redis

    def mark(self, run_id: str, reason: str) -> None:
        key = self.redis.key(C.CANCEL_KEY, run_id)
        self.redis.fail_open(lambda r: r.set(key, reason, ex=int(C.CANCEL_TTL_S)), None)

    def stopped(self, run_id: str) -> bool:
        key = self.redis.key(C.CANCEL_KEY, run_id)
        return bool(self.redis.fail_open(lambda r: r.exists(key), 0))

    def heartbeat(self, idempotency_key: str, details: Any) -> None:
        key = self.redis.key(C.HEARTBEAT_KEY, idempotency_key)
        value = json.dumps({"at": time.time(), "details": details}, default=str)
        self.redis.fail_open(lambda r: r.set(key, value, ex=int(C.HEARTBEAT_TTL_S)), None)

    def last_heartbeat(self, idempotency_key: str) -> dict[str, Any] | None:
        key = self.redis.key(C.HEARTBEAT_KEY, idempotency_key)
        raw = self.redis.fail_open(lambda r: r.get(key), None)
        return json.loads(raw) if raw else None
