"""A circuit breaker per tool, shared by the fleet through Redis.

Failures that point at the tool itself (TIMEOUT, TRANSIENT, INTERNAL) go into a
rolling window; N of them open the breaker, and the gate then treats the tool as
down. After the cool-down the first call to claim the trial (``SET NX``) is let
through, alone in the fleet: its success closes the breaker, its failure opens it
again. A call that fails because of its caller (bad arguments, permission) says
nothing about the tool and counts for neither.

pybreaker has a Redis storage, but counts consecutive failures (not a window),
lets every concurrent caller through when half-open, and wants to wrap the call
and see an exception; our calls end in results. This is the small version.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from redis import Redis

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.errors import ErrorCode
from agentfleet.harness.fleet_redis import FleetRedis
from agentfleet.harness.gate import BreakerEntry, Transition
from agentfleet.loop.transcript import ToolResult

log = logging.getLogger(__name__)
TOOL_FAULTS = frozenset({ErrorCode.TIMEOUT, ErrorCode.TRANSIENT, ErrorCode.INTERNAL})


def points_at_tool(result: ToolResult) -> bool:
    return not result.ok and result.error_code in TOOL_FAULTS


class Breaker:
    def __init__(self, redis: FleetRedis, settings: Settings, *, by: str,
                 report: Callable[[Transition], None]) -> None:
        self.redis = redis
        self.settings = settings
        self.by = by
        self.report = report

    def key(self, tool: str) -> str:
        return self.redis.key(C.BREAKER_KEY, tool)

    def claim_trial(self, tool: str, entry: BreakerEntry, hold_s: float) -> bool:
        """Be the one call a cooled-down breaker lets through; False when another call is it."""
        trial = self.redis.key(C.BREAKER_TRIAL_KEY, tool)
        half = BreakerEntry("half_open", time.time(), entry.failures)

        def claim(r: Redis) -> bool:
            if not r.set(trial, self.by, nx=True, px=int(hold_s * 1000)):
                return False
            r.set(self.key(tool), half.dumps())
            return True

        won = self.redis.fail_open(claim, True)
        if won and entry.state == "open":
            self._announce(tool, "half_open", f"letting one call through after {entry.failures} failures")
        return won

    def record(self, tool: str, result: ToolResult, *, trial: bool) -> None:
        """Count a finished call (skipped while Redis is away)."""
        fault = points_at_tool(result)
        if trial:
            self._end_trial(tool, result, fault)
        elif fault:
            self._count_failure(tool, result)

    def _count_failure(self, tool: str, result: ToolResult) -> None:
        now = time.time()
        failures = self.redis.key(C.BREAKER_FAILURES_KEY, tool)
        window = self.settings.breaker_window_s

        def count(r: Redis) -> int:
            pipe = r.pipeline(transaction=True)
            pipe.zadd(failures, {uuid.uuid4().hex: now})
            pipe.zremrangebyscore(failures, "-inf", now - window)
            pipe.zcard(failures)
            pipe.expire(failures, int(window) + 1)
            return int(pipe.execute()[2])

        n = self.redis.fail_open(count, 0)
        if n < self.settings.breaker_failures:
            return
        opened = BreakerEntry("open", now, n)
        if self.redis.fail_open(lambda r: r.set(self.key(tool), opened.dumps(), nx=True), False):
            self._announce(tool, "open", f"{n} failures in {window:g}s, the last {result.error_code}: "
                                         f"{(result.message or '')[:200]}")

    def _end_trial(self, tool: str, result: ToolResult, fault: bool) -> None:
        trial = self.redis.key(C.BREAKER_TRIAL_KEY, tool)
        if fault:
            opened = BreakerEntry("open", time.time(), self.settings.breaker_failures)

            def reopen(r: Redis) -> None:
                pipe = r.pipeline(transaction=True)
                pipe.set(self.key(tool), opened.dumps())
                pipe.delete(trial)
                pipe.execute()

            self.redis.fail_open(reopen, None)
            self._announce(tool, "open", f"the trial call failed: {result.error_code}: {(result.message or '')[:200]}")
            return

        def close(r: Redis) -> int:
            return int(r.delete(self.key(tool), self.redis.key(C.BREAKER_FAILURES_KEY, tool), trial))

        if self.redis.fail_open(close, 0):
            self._announce(tool, "closed", "the trial call succeeded")

    def _announce(self, tool: str, status: str, detail: str) -> None:
        log.warning("circuit breaker of %s is %s: %s", tool, status, detail, extra={"tool": tool})
        self.report(Transition(tool, "breaker", status, detail, time.time(), self.by))
