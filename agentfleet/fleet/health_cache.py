"""Tool health as a fleet-wide fact: one expiring Redis key per tool, re-checked by one executor.

Executors host the tool code, so they run the checks, on a timer (``HealthTimer``).
An entry lives ``ttl_s`` while healthy and ``down_ttl_s`` while down; as it nears
expiry, the next executor to notice claims the check with ``SET NX`` and the rest
leave it alone, so a fleet of N executors checks a tool about once per TTL, not N
times, and the entry does not lapse while executors run (with none left, it expires:
unknown).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from redis import Redis

from agentfleet import constants as C
from agentfleet.fleet.fleet_redis import RedisUnavailable
from agentfleet.fleet.gate import FleetFacts, HealthEntry, check_transition
from agentfleet.harness.checks import run_check
from agentfleet.tools.health import HealthCheck
from agentfleet.tools.tool import Tool

log = logging.getLogger(__name__)
CLAIM_MARGIN_S = 2.0
REFRESH_SLACK_S = 0.1  # beyond a tick: the time a check and its write may take before the entry lapses


@dataclass
class CheckPlan:
    """A check and the tools whose entries it writes (tools sharing a check share one run of it)."""

    check: HealthCheck
    tools: list[str] = field(default_factory=list)


def plan_checks(tools: Iterable[Tool]) -> dict[str, CheckPlan]:
    plans: dict[str, CheckPlan] = {}
    for t in tools:
        if t.health_check is None:
            continue
        plan = plans.setdefault(t.health_check.name, CheckPlan(t.health_check))
        if t.name not in plan.tools:
            plan.tools.append(t.name)
    return plans


class HealthCache(FleetFacts):
    def key(self, tool: str) -> str:
        return self.redis.key(C.HEALTH_KEY, tool)

    def entries(self, tools: list[str]) -> dict[str, HealthEntry | None]:
        """Cached entries by tool (fail open: Redis away means every tool is unknown)."""
        if not tools:
            return {}
        raw = self.redis.fail_open(lambda r: r.mget([self.key(t) for t in tools]), [None] * len(tools))
        return {t: HealthEntry.loads(self.redis.unseal(self.key(t), v)) for t, v in zip(tools, raw, strict=True)}

    def check_due(self, plans: Mapping[str, CheckPlan]) -> int:
        """Run every check one of whose entries is about to expire (or has) and that no other executor has
        claimed. One round trip finds them all, however many checks there are."""
        if not plans:
            return 0
        ran = 0
        try:
            for plan in self._due(list(plans.values())):
                if self._claim(plan):
                    ran += self._run(plan)
        except RedisUnavailable:
            pass
        return ran

    def _due(self, plans: list[CheckPlan]) -> list[CheckPlan]:
        """Plans with an entry within a tick (and a little) of its expiry, so it is rewritten before it lapses:
        a lapse would read as *unknown*, and offer a down tool, until the next tick."""

        def remaining(r: Redis) -> list[int]:
            pipe = r.pipeline(transaction=False)
            for plan in plans:
                for t in plan.tools:
                    pipe.pttl(self.key(t))
            return pipe.execute()

        left = iter(self.redis.attempt(remaining))  # milliseconds; -2: missing
        due = []
        for plan in plans:
            ttls = [next(left) for _ in plan.tools]
            if any(ms < self._margin_ms(plan.check) for ms in ttls):
                due.append(plan)
        return due

    def _margin_ms(self, check: HealthCheck) -> float:
        shortest = min(check.ttl_s or self.settings.health_ttl_healthy_s,
                       check.down_ttl_s or self.settings.health_ttl_down_s)
        return 1000 * min(self.settings.health_tick_s + REFRESH_SLACK_S, shortest / 2)

    def _claim_key(self, plan: CheckPlan) -> str:
        return self.redis.key(C.HEALTH_CLAIM_KEY, plan.check.name)

    def _claim(self, plan: CheckPlan) -> bool:
        hold_ms = int((self.timeout_s(plan.check) + CLAIM_MARGIN_S) * 1000)
        return bool(self.redis.attempt(lambda r: r.set(self._claim_key(plan), self.by, nx=True, px=hold_ms)))

    def timeout_s(self, check: HealthCheck) -> float:
        return check.timeout_s or self.settings.tier_timeout_s(check.tier)

    def _run(self, plan: CheckPlan) -> int:
        try:
            # Claimed: but another executor may have written the entries between our read and
            # our claim (it releases its claim after writing). Look again before running.
            if not self._due([plan]):
                return 0
            outcome = run_check(plan.check, self.timeout_s(plan.check))
            entry = HealthEntry("healthy" if outcome.healthy else "down", outcome.detail, time.time(), self.by)
            self.write(plan, entry)
            return 1
        finally:
            self.redis.fail_open(lambda r: r.delete(self._claim_key(plan)), 0)

    def write(self, plan: CheckPlan, entry: HealthEntry) -> None:
        check = plan.check
        ttl = (check.ttl_s or self.settings.health_ttl_healthy_s) if entry.status == "healthy" \
            else (check.down_ttl_s or self.settings.health_ttl_down_s)
        value = entry.dumps()

        def store(r: Redis) -> list[object]:
            pipe = r.pipeline(transaction=False)
            for t in plan.tools:
                pipe.set(self.key(t), self.redis.seal(self.key(t), value), px=int(ttl * 1000))
                pipe.set(self.redis.key(C.HEALTH_LAST_KEY, t), entry.status, get=True)
            return pipe.execute()

        replies = self.redis.attempt(store)
        for t, previous in zip(plan.tools, replies[1::2], strict=True):
            change = check_transition(t, previous, entry)
            if change is not None:
                log.warning("tool %s is now %s", t, entry.status, extra={"tool": t, "detail": entry.detail})
                self.report(change)
