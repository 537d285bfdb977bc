"""The one retry layer for model calls (models/retrying.py): which errors are tried again, and how long apart."""

from __future__ import annotations

import pytest

from agentfleet.errors import ModelAuthError, ModelError, ModelUnavailable
from agentfleet.models.retrying import RetryPolicy, with_retries


def test_only_passing_errors_are_tried_again_and_never_past_the_attempts() -> None:
    policy = RetryPolicy(attempts=3, base_delay_s=1.0, max_delay_s=5.0)
    busy = ModelUnavailable("503")
    assert policy.delay_s(1, busy, rand=lambda: 1.0) == 1.0
    assert policy.delay_s(2, busy, rand=lambda: 1.0) == 2.0
    assert policy.delay_s(3, busy, rand=lambda: 1.0) is None  # the third try was the last
    assert policy.delay_s(1, ModelError("no turn for iteration 3")) is None  # a script that ran out
    assert policy.delay_s(1, ModelAuthError("401")) is None
    assert policy.delay_s(1, RuntimeError("adapter bug")) is None


def test_backoff_is_full_jitter_under_a_doubling_cap_and_retry_after_is_honoured_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=0.5, max_delay_s=4.0)
    busy = ModelUnavailable("429")
    assert [policy.delay_s(a, busy, rand=lambda: 1.0) for a in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert policy.delay_s(4, busy, rand=lambda: 0.25) == 1.0
    assert policy.delay_s(1, ModelUnavailable("429", retry_after_s=3)) == 3.0
    assert policy.delay_s(1, ModelUnavailable("429", retry_after_s=60)) == 4.0  # never longer than the cap


def test_with_retries_returns_the_first_success_and_gives_up_with_the_last_error() -> None:
    slept: list[float] = []
    tries = iter([ModelUnavailable("a"), ModelUnavailable("b"), "turn"])

    def flaky() -> str:
        got = next(tries)
        if isinstance(got, Exception):
            raise got
        return got

    policy = RetryPolicy(attempts=4, base_delay_s=1.0)
    assert with_retries(flaky, policy, sleep=slept.append, rand=lambda: 0.5) == "turn"
    assert slept == [0.5, 1.0]

    calls: list[int] = []

    def down() -> str:
        calls.append(1)
        raise ModelUnavailable(f"down {len(calls)}")

    with pytest.raises(ModelUnavailable, match="down 4"):
        with_retries(down, policy, sleep=lambda s: None)
    assert len(calls) == 4

    calls.clear()

    def refused() -> str:
        calls.append(1)
        raise ModelAuthError("401")

    with pytest.raises(ModelAuthError):
        with_retries(refused, policy, sleep=lambda s: None)
    assert len(calls) == 1


def test_tries_go_on_from_a_first_made_elsewhere_never_past_the_attempts_in_all() -> None:
    """The planner's first try, made before anything was written, failed and may be retried: the policy's wait for it,
    then the second try; as many tries in all as when every one is made here."""
    slept: list[float] = []
    calls: list[int] = []

    def down() -> str:
        calls.append(1)
        raise ModelUnavailable(f"down {len(calls) + 1}")

    policy = RetryPolicy(attempts=4, base_delay_s=1.0)
    with pytest.raises(ModelUnavailable, match="down 4"):
        with_retries(down, policy, sleep=slept.append, rand=lambda: 0.5, failed=ModelUnavailable("down 1"))
    assert len(calls) == 3 and slept == [0.5, 1.0, 2.0]
    assert with_retries(lambda: "turn", policy, sleep=slept.append, rand=lambda: 0.5,
                        failed=ModelUnavailable("429", retry_after_s=0.25)) == "turn"
    assert slept[-1] == 0.25
    with pytest.raises(ModelAuthError):  # not worth another try: raised as it came, nothing called
        with_retries(lambda: calls.append(1) or "turn", policy, failed=ModelAuthError("401"))
    assert len(calls) == 3
    assert RetryPolicy(attempts=1).retries(1, ModelUnavailable("503")) is False
    assert policy.retries(1, ModelUnavailable("503")) and not policy.retries(4, ModelUnavailable("503"))
