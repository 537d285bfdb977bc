"""A fleet-wide rate limit per model (requests and tokens per minute, or any window), shared through Redis.

Every planner process counts against the same moving windows (``limits``' Redis storage), so adding
planners spreads the provider's quota rather than multiplying it into a storm of 429s. A planner that must
wait sleeps until the window has room and no longer (the worker thread is held for the wait, not re-queued:
the wait is at most one window, the plan step holds its lock and its idempotency key meanwhile, and a
re-queued step would have to rebuild its prompt and compete for the lock again for nothing).

Tokens are counted before the call from the prompt's estimate (context/builder.py) and trued up after it
from the provider's usage. Redis down: calls go ahead unlimited (logged), since the provider's own 429s
still stop a storm and the retry layer waits them out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import limits
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter
from pydantic import BaseModel, ConfigDict, field_validator

from agentfleet.context.builder import estimate_tokens
from agentfleet.loop.transcript import ModelTurn
from agentfleet.models.base import Model, ModelRequest

log = logging.getLogger(__name__)


class ModelRateLimit(BaseModel):
    """``limits`` notation: ``"60/minute"``, ``"2/second"``, ``"200000/minute"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: str | None = None
    tokens: str | None = None

    @field_validator("requests", "tokens")
    @classmethod
    def _parses(cls, value: str | None) -> str | None:
        if value is not None:
            limits.parse(value)  # ValueError names what is wrong; settings fail at start-up
        return value


class ModelRateLimiter:
    """Moving windows per model name, in ``storage_uri`` (``redis://…`` in a fleet, ``memory://`` embedded)."""

    def __init__(self, table: Mapping[str, ModelRateLimit], storage_uri: str, *, key_prefix: str,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> None:
        self.table = dict(table)
        options: dict[str, Any] = {"key_prefix": key_prefix} if storage_uri.startswith("redis") else {}
        self.limiter = MovingWindowRateLimiter(storage_from_string(storage_uri, **options))
        self.sleep, self.clock = sleep, clock

    def limits_for(self, *names: str) -> ModelRateLimit | None:
        return next((self.table[n] for n in (*names, "*") if n in self.table), None)

    def acquire(self, key: str, rule: ModelRateLimit, tokens: int) -> float:
        """Take a request and ``tokens`` from the model's windows, waiting for room; the seconds waited."""
        waited = 0.0
        for spec, cost in ((rule.requests, 1), (rule.tokens, tokens)):
            if spec is not None and cost > 0:
                waited += self._take(limits.parse(spec), key, cost)
        return waited

    def settle(self, key: str, rule: ModelRateLimit, estimated: int, used: int) -> None:
        """Count the tokens a call used beyond the estimate taken before it (without waiting)."""
        if rule.tokens is not None and used > estimated:
            item = limits.parse(rule.tokens)
            try:
                self.limiter.hit(item, key, cost=min(used - estimated, item.amount))
            except Exception as exc:
                log.warning("rate limit store unreachable (%s); usage not counted", exc)

    def _take(self, item: limits.RateLimitItem, key: str, cost: int) -> float:
        cost = min(cost, item.amount)  # more than a whole window's worth waits for an empty window
        waited = 0.0
        while True:
            try:
                if self.limiter.hit(item, key, cost=cost):
                    return waited
                reset = self.limiter.get_window_stats(item, key).reset_time
            except Exception as exc:
                log.warning("rate limit store unreachable (%s); calling %s without the limit", exc, key)
                return waited
            pause = min(max(reset - self.clock(), 0.005), float(item.get_expiry()))
            log.info("model %s at its rate limit %s; waiting %.2fs", key, item, pause,
                     extra={"rate_limit": str(item), "wait_s": round(pause, 3)})
            self.sleep(pause)
            waited += pause


class RateLimitedModel:
    """A model whose calls take their share of the fleet's rate limit first (Pydantic AI's wrapper way)."""

    longest_call_s: float | None = None  # a call may wait for its window first, however fast the model

    def __init__(self, model: Model, limiter: ModelRateLimiter, rule: ModelRateLimit) -> None:
        self.model, self.limiter, self.rule = model, limiter, rule
        self.key = getattr(model, "model", None) or model.name

    def __getattr__(self, name: str) -> Any:  # name, offline, context_window: the wrapped model's
        return getattr(self.model, name)

    def complete(self, request: ModelRequest) -> ModelTurn:
        estimated = estimate_tokens(request.messages)
        ready = getattr(self.model, "ready", None)
        if callable(ready):  # an SDK client built after the permit would put the request on the wire late
            ready()
        self.limiter.acquire(self.key, self.rule, estimated)
        turn = self.model.complete(request)
        self.limiter.settle(self.key, self.rule, estimated, turn.usage.total_tokens)
        return turn


def rate_limited(table: Mapping[str, ModelRateLimit], storage_uri: str, key_prefix: str
                 ) -> Callable[[Model], Model]:
    """What wraps each agent's model in a process: models without a limit are left as they are."""
    limiter = ModelRateLimiter(table, storage_uri, key_prefix=key_prefix)

    def wrap(model: Model) -> Model:
        rule = limiter.limits_for(model.name, getattr(model, "model", None) or model.name)
        return RateLimitedModel(model, limiter, rule) if rule else model

    return wrap
