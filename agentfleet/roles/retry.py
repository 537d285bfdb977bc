"""When a step that failed for a passing reason is tried again: one policy, decided per error.

Transient means the same step may succeed later without any change: the database or the
broker was unreachable, another worker holds the step right now, or this worker lacks an
agent that another may load. Everything else is a
bug or a bad message, and is not retried (it is dead-lettered with its reason). Retries go
through the broker with a countdown, so a waiting step holds no worker slot.
"""

from __future__ import annotations

import random
from typing import Any

from kombu.exceptions import OperationalError as BrokerUnreachable
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.exc import OperationalError as DatabaseUnreachable

from agentfleet.errors import AgentfleetError

# Transient step failures: broker-side retries with exponential backoff (full jitter).
STEP_RETRY_FIRST_DELAY_S = 0.25


class InFlight(Exception):
    """Another worker holds this step right now: try again later, until it is free or its outcome exists."""


class CommitPending(Exception):
    """The step's outcome is known (a tool ran, the model answered) but could not be committed.

    ``carry`` rides in the retried message, so the retry commits that outcome instead of finding
    only the intent (which would make a non-idempotent call UNKNOWN_OUTCOME, or call the model again).
    """

    def __init__(self, carry: dict[str, Any], cause: BaseException) -> None:
        super().__init__(f"outcome not committed yet: {cause}")
        self.carry = carry


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, InFlight | CommitPending | DatabaseUnreachable | InterfaceError | BrokerUnreachable):
        return True
    if isinstance(exc, AgentfleetError):  # our own errors say so themselves (AgentNotLoaded)
        return exc.retryable
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def outcome_at_risk(exc: BaseException) -> bool:
    """A commit failed for a passing reason after the outcome was known: carry it (CommitPending).
    Not when the step is held elsewhere: then its holder's outcome is the one that counts."""
    return is_transient(exc) and not isinstance(exc, InFlight)


def retry_delay(attempt: int, max_delay_s: float) -> float:
    """Exponential backoff with equal jitter: at least half of each step, so the total is bounded below."""
    ceiling = min(max_delay_s, STEP_RETRY_FIRST_DELAY_S * 2**attempt)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def max_retries(max_delay_s: float, window_s: float) -> int:
    """How many retries it takes for the shortest possible delays to add up to ``window_s``."""
    total, attempt = 0.0, 0
    while total < window_s:
        total += min(max_delay_s, STEP_RETRY_FIRST_DELAY_S * 2**attempt) / 2
        attempt += 1
    return attempt
