"""The one place model calls are retried, and which errors are worth it.

An adapter says what went wrong by the exception it raises: ``ModelUnavailable``
(rate limited, overloaded, timed out, unreachable: worth another try, after its
``retry_after_s`` if the provider said one) or any other ``ModelError`` (bad
credentials, a request the provider refuses, a cassette or script that has run out:
the same request fails the same way, so it is not tried again). The SDKs' own
retries stay off, so a call is never retried by two layers at once.

The wait is full-jitter exponential backoff (each delay a random share of a doubling
cap), which spreads many planners retrying after the same outage.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from agentfleet.errors import ModelError
from agentfleet.loop.transcript import ModelTurn
from agentfleet.models.base import Model, ModelRequest

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # tries in all, the first included
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0

    def retries(self, attempt: int, exc: BaseException) -> bool:
        """Whether try ``attempt``, ended by ``exc``, is followed by another."""
        return isinstance(exc, ModelError) and exc.retryable and attempt < self.attempts

    def delay_s(self, attempt: int, exc: BaseException, rand: Callable[[], float] = random.random) -> float | None:
        """How long to wait before try ``attempt + 1`` after ``exc`` ended try ``attempt``; None: give up."""
        if not self.retries(attempt, exc):
            return None
        asked = getattr(exc, "retry_after_s", None)
        if asked is not None:
            return min(max(0.0, float(asked)), self.max_delay_s)
        return rand() * min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))


def with_retries(call: Callable[[], T], policy: RetryPolicy, *, sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random, failed: Exception | None = None) -> T:
    """``call()``, tried again as ``policy`` says for each error. ``failed``: the first try was made already, elsewhere,
    and ended so (the planner's try made before anything was written, ``loop/recovery.model_first``): the tries go on
    from the second, after the wait the policy gives the first's error."""
    attempt, exc = 1, failed
    while True:
        if exc is not None:
            wait = policy.delay_s(attempt, exc, rand)
            if wait is None:
                raise exc
            log.warning("model call failed (try %d of %d): %s; retrying in %.2fs", attempt, policy.attempts, exc,
                        wait, extra={"retry_in_s": round(wait, 3)})
            sleep(wait)
            attempt += 1
        try:
            return call()
        except Exception as caught:
            exc = caught


class RetryingModel:
    """A model whose calls are retried by ``policy`` (for using a model outside the fleet's planner, which
    applies the same policy itself, each try through the hooks)."""

    def __init__(self, model: Model, policy: RetryPolicy | None = None) -> None:
        self.model = model
        self.policy = policy or RetryPolicy()
        self.name = model.name
        self.offline = model.offline

    def complete(self, request: ModelRequest) -> ModelTurn:
        return with_retries(lambda: self.model.complete(request), self.policy)
