"""What people did to the fleet (approve, deny, cancel, replay, scale, purge), from the console or the CLI.

A run's transitions are in ``audit``; an operator's action may move no run (a scale, a replayed dead letter) or
be refused, and is worth keeping either way: who asked, by which way, for what, and what came of it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import as_utc, now


class Actions(StoreBase):
    """The operators' trail."""

    def record_action(self, *, actor: str, via: str, action: str, target: str, outcome: str,
                      detail: dict[str, Any], run_id: str | None = None) -> None:
        with self.tx() as conn:
            conn.execute(insert(T.operator_actions).values(
                at=now(), actor=actor[:255], via=via[:16], action=action[:32], target=target[:255],
                run_id=run_id, outcome=outcome[:16], detail=detail))

    def actions(self, *, run_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first; a run's own, or everyone's."""
        a = T.operator_actions
        stmt = select(a).order_by(a.c.id.desc()).limit(limit)
        if run_id is not None:
            stmt = stmt.where(a.c.run_id == run_id)
        with self.reading() as conn:
            return [{**r._mapping, "at": as_utc(r.at)} for r in conn.execute(stmt).all()]
