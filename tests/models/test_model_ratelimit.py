"""The rate limiter's windows on in-process storage (the Redis-shared case is tests/integration)."""

from __future__ import annotations

import pytest

from agentfleet.config.settings import Settings
from agentfleet.models.ratelimit import ModelRateLimit, ModelRateLimiter


def limiter(uri: str = "memory://") -> ModelRateLimiter:
    return ModelRateLimiter({}, uri, key_prefix="t:ratelimit")


def test_a_token_window_makes_the_next_call_wait_for_room() -> None:
    rule = ModelRateLimit(tokens="100/second")
    lim = limiter()
    assert lim.acquire("m", rule, 80) == 0.0
    assert lim.acquire("m", rule, 80) > 0.0  # waited for the first call's tokens to leave the window


def test_tokens_used_beyond_the_estimate_are_counted_after_the_call() -> None:
    rule = ModelRateLimit(tokens="100/second")
    lim = limiter()
    lim.acquire("m", rule, 10)
    lim.settle("m", rule, estimated=10, used=95)
    assert lim.acquire("m", rule, 10) > 0.0


def test_a_request_bigger_than_the_window_waits_for_an_empty_window_rather_than_forever() -> None:
    rule = ModelRateLimit(tokens="50/second")
    lim = limiter()
    assert lim.acquire("m", rule, 10_000) == 0.0
    assert lim.acquire("m", rule, 10_000) > 0.0


def test_models_are_limited_apart_and_star_covers_the_rest() -> None:
    lim = ModelRateLimiter({"a": ModelRateLimit(requests="1/minute"), "*": ModelRateLimit(requests="5/minute")},
                           "memory://", key_prefix="x")
    assert lim.limits_for("a") == ModelRateLimit(requests="1/minute")
    assert lim.limits_for("b") == ModelRateLimit(requests="5/minute")


def test_an_unreachable_store_lets_calls_through(caplog: pytest.LogCaptureFixture) -> None:
    lim = limiter("redis://127.0.0.1:1/0")
    assert lim.acquire("m", ModelRateLimit(requests="1/second"), 1) == 0.0
    assert "unreachable" in caplog.text


def test_a_limit_in_settings_that_does_not_parse_stops_start_up() -> None:
    with pytest.raises(ValueError, match="model_rate_limits"):
        Settings(model_rate_limits={"m": {"requests": "lots"}})
