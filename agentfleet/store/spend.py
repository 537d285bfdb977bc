"""A tree's spend: each turn's usage added to every ancestor, and the reservations of turns in flight."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, update

from agentfleet.loop.budgets import Reservation
from agentfleet.loop.transcript import Usage
from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase


class Spend(StoreBase):
    """A tree's spend and reservations."""

    def add_spend(self, conn: Connection, run_ids: list[str], usage: Usage | None,
                  release: Reservation | None = None) -> None:
        """Count a delegated run's model turn (``usage``; None: the turn was not taken) in each of its ancestors'
        spend, and give back what the turn had reserved there, in the transaction that records the turn (once,
        however often the step is retried): one budget per tree, live. No state change."""
        r = T.runs.c
        values: dict[str, Any] = {}
        if usage is not None:
            values = dict(steps_used=r.steps_used + 1, input_tokens=r.input_tokens + usage.input_tokens,
                          output_tokens=r.output_tokens + usage.output_tokens, cost_usd=r.cost_usd + usage.cost_usd,
                          cached_input_tokens=r.cached_input_tokens + usage.cached_input_tokens)
            if usage.unpriced:
                values["unpriced"] = True
        if release is not None:
            values.update(reserved_tokens=r.reserved_tokens - release.tokens,
                          reserved_cost_usd=r.reserved_cost_usd - release.cost_usd,
                          reserved_steps=r.reserved_steps - release.steps)
        if values:
            conn.execute(update(T.runs).where(r.run_id.in_(run_ids)).values(**values))

    def reserve(self, conn: Connection, run_ids: list[str], reservation: Reservation) -> None:
        """Hold a turn's estimate in each ancestor until the turn records what it spent (``add_spend``)."""
        r = T.runs.c
        conn.execute(update(T.runs).where(r.run_id.in_(run_ids)).values(
            reserved_tokens=r.reserved_tokens + reservation.tokens,
            reserved_cost_usd=r.reserved_cost_usd + reservation.cost_usd,
            reserved_steps=r.reserved_steps + reservation.steps))
