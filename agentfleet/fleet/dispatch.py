"""Health-gated dispatch: what the planner offers and what the executor runs.

One object per process composes the fleet-wide facts (health entries, breakers)
with the pure rules in ``gate``: ``offer`` filters an agent's tools for the model,
``call`` refuses a tool that is down before it starts (no thread, no subprocess),
serves read-only results from the cache, holds a declared resource lock, runs the
call and tells the breaker how it went.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.errors import ErrorCode, ToolError
from agentfleet.fleet.breaker import Breaker
from agentfleet.fleet.fleet_redis import FleetRedis
from agentfleet.fleet.gate import Availability, BreakerEntry, HealthEntry, Offer, Transition, offer
from agentfleet.fleet.health_cache import HealthCache
from agentfleet.fleet.locks import resource_lock
from agentfleet.fleet.result_cache import ResultCache
from agentfleet.harness.runner import run_bound
from agentfleet.loop.transcript import ToolResult
from agentfleet.tools.tool import Tool, ToolContext

TRIAL_MARGIN_S = 5.0


class ToolDispatch:
    def __init__(self, redis: FleetRedis, settings: Settings, *, by: str,
                 report: Callable[[Transition], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self._clock = clock  # how old a reused view is; a test passes its own to turn the window without sleeping
        self.settings = settings
        self.health = HealthCache(redis, settings, by, report)
        self.breaker = Breaker(redis, settings, by, report)
        self.cache = ResultCache(redis)
        self._good_offers: dict[tuple[str, ...], tuple[float, Offer]] = {}

    def availability(self, tools: Sequence[str]) -> dict[str, Availability]:
        """Each tool's availability now, from one round trip for health entries and breakers."""
        names = list(tools)
        facts, _ = self._read(names)
        now, cooldown = time.time(), self.settings.breaker_cooldown_s
        return {t: Availability.of(health, breaker, now, cooldown) for t, (health, breaker) in facts.items()}

    def _read(self, names: list[str], *extra: str) -> tuple[dict[str, tuple[HealthEntry | None, BreakerEntry | None]],
                                                             list[str | None]]:
        """Health entries and breakers of ``names`` (unsealed), and the raw values of ``extra`` keys: one MGET."""
        if not names and not extra:
            return {}, []
        keys = [self.health.key(t) for t in names] + [self.breaker.key(t) for t in names] + list(extra)
        # The cache's waiting writes go first, in the same round trip (``ResultCache.read_with_writes``).
        raw = self.redis.fail_open(lambda r: self.cache.read_with_writes(r, lambda c: c.mget(keys)),
                                   [None] * len(keys))
        n = len(names)
        opened = [self.redis.unseal(k, v) for k, v in zip(keys[:2 * n], raw, strict=False)]  # forged: missing
        facts = {t: (HealthEntry.loads(opened[i]), BreakerEntry.loads(opened[n + i])) for i, t in enumerate(names)}
        return facts, raw[2 * n:]

    def offer(self, tools: Sequence[Tool], elsewhere: Mapping[str, str] | None = None) -> Offer:
        """The tools to offer the model now (fallbacks in place of down tools) and what is missing.

        Good news is reused for ``gate_view_s``: while every tool is available and every breaker
        closed, a planner reads Redis about once a ``gate_view_s`` instead of once an iteration
        (a round trip each, measured at 0.3 ms on a busy 2-core machine). Bad news is read again
        every time, so a recovered tool is offered at its next iteration; a tool that goes down
        within the window is refused by the executor, which always reads fresh.

        ``elsewhere``: tools unavailable for a reason outside Redis (their dedicated queue has no consumer), with
        it; such a view is never reused.
        """
        names = tuple(t.name for t in tools)
        now = self._clock()
        seen = self._good_offers.get(names)
        if not elsewhere and seen is not None and now - seen[0] < self.settings.gate_view_s:
            return seen[1]
        availability = self.availability(names)
        for name, why in (elsewhere or {}).items():
            if name in availability:
                availability[name] = Availability(False, why)
        made = offer([(t.name, t.fallback) for t in tools], availability)
        if all(a.available and a.breaker == "closed" for a in availability.values()):
            self._good_offers[names] = (now, made)
        else:
            self._good_offers.pop(names, None)
        return made

    def status(self, tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """What ``agentfleet tools`` shows: each tool's declaration and the fleet's facts about it."""
        names = [t.name for t in tools]
        facts, hits = self._read(names, *(self.redis.key(C.CACHE_HITS_KEY, n) for n in names))
        now, rows = time.time(), []
        for i, t in enumerate(tools):
            entry, breaker = facts[t.name]
            here = Availability.of(entry, breaker, now, self.settings.breaker_cooldown_s)
            rows.append({
                "tool": t.name, "kind": t.kind, "tier": t.tier, "timeout_s": t.effective_timeout_s(self.settings),
                "idempotent": t.idempotent, "read_only": t.read_only, "fallback": t.fallback, "lock": t.lock,
                "check": t.health_check.name if t.health_check else None,
                "health": entry.status if entry else "unknown",
                "age_s": round(now - entry.checked_at, 1) if entry else None,
                "detail": entry.detail if entry else None, "checked_by": entry.checked_by if entry else None,
                "breaker": breaker.state if breaker else "closed", "available": here.available,
                "why_not": here.reason, "cache_hits": int(hits[i] or 0),
            })
        return rows

    def call(self, tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        started = time.perf_counter()
        try:
            kwargs = tool.bind(arguments)
        except ToolError as exc:
            return ToolResult.failure(exc.code, exc.message, exc.hint, _ms(started))
        if ctx.past_deadline:
            return _past_deadline(tool, "was not started", _ms(started))
        timeout = ctx.time_left(tool.effective_timeout_s(self.settings))
        ttl = self.settings.tool_cache_ttl_s if tool.cache_ttl_s is None else tool.cache_ttl_s
        cache_key = self.cache.key(tool.name, kwargs) if tool.read_only and ttl > 0 else None
        # One round trip on the hot path: the tool's health, its breaker, whether its run has ended (cancelled,
        # out of time) and, read-only, its cached result.
        ended_key = self.redis.key(C.CANCEL_KEY, ctx.run_id)
        facts, extra = self._read([tool.name], ended_key, *([cache_key] if cache_key else []))
        ended = self.redis.unseal(ended_key, extra[0])  # what the fleet sealed, or None: a tool can reach Redis
        cached = [self.redis.unseal(cache_key, extra[1])] if cache_key else []
        if ended is not None:
            return ToolResult.failure(ErrorCode.CANCELLED, f"{tool.name} was not started: its run has ended "
                                                           f"({_text(ended)})", None, _ms(started))
        health, breaker = facts[tool.name]
        here = Availability.of(health, breaker, time.time(), self.settings.breaker_cooldown_s)
        trial = None
        if here.available and here.trial_due and breaker is not None:
            trial = self.breaker.claim_trial(tool.name, breaker, timeout + TRIAL_MARGIN_S)
            if not trial.admitted:
                here = Availability(False, "another call is testing whether it has recovered", breaker="half_open")
        if not here.available:
            return _unavailable(tool, here, _ms(started))
        if cache_key and not (trial and trial.token):  # a trial must reach the tool
            hit, output = self.cache.decode(tool.name, cached[0])
            if hit:
                return ToolResult(ok=True, output=output, duration_ms=_ms(started), cache_hit=True)
        result, ran = self._run(tool, kwargs, ctx, timeout, started)
        if not result.ok and ctx.past_deadline:  # cut by the run's deadline, not by its own timeout or fault
            return _past_deadline(tool, "was stopped", result.duration_ms)
        if ran:
            self.breaker.record(tool.name, result, trial=trial)
        else:
            self.breaker.abandon(tool.name, trial)
        if cache_key and result.ok:
            self.cache.put(cache_key, result.output, ttl)
        return result

    def _run(self, tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, timeout: float,
             started: float) -> tuple[ToolResult, bool]:
        """The call's result, and whether the tool ran (a busy resource lock keeps it from running)."""
        resource = tool.lock_key(kwargs)
        if resource is None:
            return run_bound(tool, kwargs, ctx, timeout, started), True
        try:
            # Held past the timeout so a call abandoned there (still running) keeps others out a while.
            with resource_lock(self.redis, resource, owner=ctx.idempotency_key, wait_s=timeout,
                               hold_s=2 * timeout + TRIAL_MARGIN_S) as held:
                result = run_bound(tool, kwargs, ctx, timeout, time.perf_counter())
                if result.error_code == ErrorCode.TIMEOUT:
                    held.keep()
                return result, True
        except ToolError as exc:  # the lock was not had: the tool did not run
            return ToolResult.failure(exc.code, exc.message, exc.hint, _ms(started), retryable=True), False


def _unavailable(tool: Tool, here: Availability, duration_ms: float) -> ToolResult:
    hint = (f"Use {tool.fallback} instead, or call {tool.name} again later." if tool.fallback
            else f"Do without {tool.name}, or call it again later.")
    return ToolResult.failure(ErrorCode.TOOL_UNAVAILABLE, f"{tool.name} is unavailable: {here.reason}", hint,
                              duration_ms, retryable=True)


def _past_deadline(tool: Tool, what: str, duration_ms: float) -> ToolResult:
    return ToolResult.failure(ErrorCode.DEADLINE, f"{tool.name} {what}: its run's deadline passed",
                              "The run is ending; nothing more runs for it.", duration_ms)


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


