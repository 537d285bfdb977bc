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
from dataclasses import dataclass

from redis import Redis

from agentfleet import constants as C
from agentfleet.errors import ErrorCode
from agentfleet.fleet.gate import BreakerEntry, FleetFacts, Transition
from agentfleet.loop.transcript import ToolResult

log = logging.getLogger(__name__)
TOOL_FAULTS = frozenset({ErrorCode.TIMEOUT, ErrorCode.TRANSIENT, ErrorCode.INTERNAL})

# KEYS: breaker, trial. ARGV: the breaker as read, our token, hold (ms), the half-open breaker.
CLAIM_TRIAL = """
local current = redis.call('GET', KEYS[1])
if not current then return 2 end
if current ~= ARGV[1] then return 0 end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[4])
return 1
"""
TRIAL_CLAIMED, TRIAL_CLOSED = 1, 2
# KEYS: breaker, trial, failures. ARGV: our token, then CLOSE, ABANDON (the tool did not run: the next
# call may be the trial) or the re-opened breaker.
END_TRIAL = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if ARGV[2] == 'close' then redis.call('DEL', KEYS[1], KEYS[3])
elseif ARGV[2] ~= 'abandon' then redis.call('SET', KEYS[1], ARGV[2]) end
redis.call('DEL', KEYS[2])
return 1
"""
CLOSE, ABANDON = "close", "abandon"


@dataclass(frozen=True)
class Trial:
    """Whether a call may go ahead, and its token when it is the breaker's trial."""

    admitted: bool
    token: str | None = None


def points_at_tool(result: ToolResult) -> bool:
    return not result.ok and result.error_code in TOOL_FAULTS


class Breaker(FleetFacts):
    def key(self, tool: str) -> str:
        return self.redis.key(C.BREAKER_KEY, tool)

    def claim_trial(self, tool: str, entry: BreakerEntry, hold_s: float) -> Trial:
        """Try to be the one call a cooled-down breaker lets through.

        Compare-and-set on the breaker as it was read (a script, atomic in Redis): a breaker that
        closed, re-opened or was claimed since is not claimed again, so a late reader never
        resurrects a half-open state another call has already ended.
        """
        token = uuid.uuid4().hex
        half = BreakerEntry("half_open", time.time(), entry.failures)
        keys = [self.key(tool), self.redis.key(C.BREAKER_TRIAL_KEY, tool)]
        seal = self.redis.seal  # compared as stored: the entry as read sealed again is the same string
        args = [seal(keys[0], entry.dumps()), token, int(hold_s * 1000), seal(keys[0], half.dumps())]
        won = self.redis.fail_open(lambda r: int(r.eval(CLAIM_TRIAL, 2, *keys, *args)), TRIAL_CLOSED)
        if won == TRIAL_CLAIMED:
            if entry.state == "open":
                self._announce(tool, "half_open", f"letting one call through after {entry.failures} failures")
            return Trial(True, token)
        return Trial(won == TRIAL_CLOSED)  # closed meanwhile: an ordinary call; else another call is the trial

    def record(self, tool: str, result: ToolResult, *, trial: Trial | None) -> None:
        """Count a call the tool ran (skipped while Redis is away)."""
        fault = points_at_tool(result)
        if trial is not None and trial.token:
            self._end_trial(tool, result, fault, trial.token)
        elif fault:
            self._count_failure(tool, result)

    def abandon(self, tool: str, trial: Trial | None) -> None:
        """The call never reached the tool (its resource lock was busy): says nothing of the tool, and a
        trial it held passes to the next call."""
        if trial is not None and trial.token:
            self._end(tool, trial.token, ABANDON)

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
        sealed = self.redis.seal(self.key(tool), opened.dumps())
        if self.redis.fail_open(lambda r: r.set(self.key(tool), sealed, nx=True), False):
            self._announce(tool, "open", f"{n} failures in {window:g}s, the last {result.error_code}: "
                                         f"{(result.message or '')[:200]}")

    def _end_trial(self, tool: str, result: ToolResult, fault: bool, token: str) -> None:
        """The trial's outcome decides, if it is still the trial (its claim may have expired meanwhile)."""
        reopened = self.redis.seal(self.key(tool), BreakerEntry("open", time.time(), self.settings.breaker_failures)
                                   .dumps()) if fault else CLOSE
        if not self._end(tool, token, reopened):
            return
        if fault:
            self._announce(tool, "open", f"the trial call failed: {result.error_code}: {(result.message or '')[:200]}")
        else:
            self._announce(tool, "closed", "the trial call succeeded")

    def _end(self, tool: str, token: str, outcome: str) -> bool:
        keys = [self.key(tool), self.redis.key(C.BREAKER_TRIAL_KEY, tool), self.redis.key(C.BREAKER_FAILURES_KEY, tool)]
        return bool(self.redis.fail_open(lambda r: int(r.eval(END_TRIAL, 3, *keys, token, outcome)), 0))

    def _announce(self, tool: str, status: str, detail: str) -> None:
        log.warning("circuit breaker of %s is %s: %s", tool, status, detail, extra={"tool": tool})
        self.report(Transition(tool, "breaker", status, detail, time.time(), self.by))
