"""Results of read-only tools, reused fleet-wide for a while.

The key is the tool's name and its validated arguments in canonical JSON (defaults
filled in, keys sorted), so ``{}`` and ``{"path": "."}`` are one entry when ``.`` is
the default. A hit is marked on the result (``cache_hit``) and so in the step's
checkpoint: replay and audit say that no tool ran.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic_core import to_jsonable_python

from agentfleet import constants as C
from agentfleet.harness.fleet_redis import FleetRedis


def canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(to_jsonable_python(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ResultCache:
    def __init__(self, redis: FleetRedis) -> None:
        self.redis = redis

    def key(self, tool: str, arguments: dict[str, Any]) -> str:
        digest = hashlib.sha256(canonical(arguments).encode()).hexdigest()
        return self.redis.key(C.CACHE_KEY, tool, digest)

    def decode(self, tool: str, raw: str | None) -> tuple[bool, Any]:
        """``(hit, output)`` from a stored value (the dispatcher reads it with the tool's health: one round trip);
        a hit is counted."""
        if raw is None:
            return False, None
        try:
            output = json.loads(raw)
        except ValueError:
            return False, None
        self.redis.fail_open(lambda r: r.incr(self.redis.key(C.CACHE_HITS_KEY, tool)), 0)
        return True, output

    def put(self, key: str, output: Any, ttl_s: float) -> None:
        encoded = json.dumps(output)
        self.redis.fail_open(lambda r: r.set(key, encoded, px=int(ttl_s * 1000)), None)

    def hits(self, tool: str) -> int:
        return int(self.redis.fail_open(lambda r: r.get(self.redis.key(C.CACHE_HITS_KEY, tool)), None) or 0)
