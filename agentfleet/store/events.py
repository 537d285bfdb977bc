"""Events the fleet keeps: tool health changes and domain events, stored as they were published."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import as_utc, now


class Events(StoreBase):
    """Tool health changes and domain events."""

    def record_health_change(self, conn: Connection, *, event_id: str, tool: str, kind: str, status: str,
                             detail: str | None, by: str, occurred_at: datetime) -> None:
        self._insert_ignore(conn, T.tool_health_events,
                            dict(event_id=event_id, tool=tool, kind=kind, status=status,
                                 detail=(detail or "")[:1000] or None, by=by[:255], occurred_at=occurred_at),
                            ["event_id"])

    def health_changes(self, tool: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """The latest changes, newest first."""
        query = select(T.tool_health_events).order_by(T.tool_health_events.c.occurred_at.desc()).limit(limit)
        if tool is not None:
            query = query.where(T.tool_health_events.c.tool == tool)
        with self.reading() as conn:
            rows = conn.execute(query).mappings().all()
        return [{**row, "occurred_at": as_utc(row["occurred_at"])} for row in rows]

    def record_domain_event(self, conn: Connection, *, event_id: str, name: str, payload: dict[str, Any],
                            source: str, run_id: str | None, step_key: str | None, trace_id: str) -> bool:
        """Keep a domain event once; True when this call recorded it (the first delivery)."""
        return self._insert_ignore(conn, T.domain_events, {
            "event_id": event_id, "name": name, "payload": payload, "source": source, "run_id": run_id,
            "step_key": step_key, "trace_id": trace_id, "recorded_at": now()}, ["event_id"])

    def domain_event(self, event_id: str, conn: Connection | None = None) -> dict[str, Any] | None:
        """One recorded domain event (in the caller's transaction when given one)."""
        stmt = select(T.domain_events).where(T.domain_events.c.event_id == event_id)
        if conn is not None:
            row = conn.execute(stmt).first()
        else:
            with self.reading() as own:
                row = own.execute(stmt).first()
        return dict(row._mapping) if row is not None else None

    def domain_events(self, *, name: str | None = None, run_id: str | None = None, event_id: str | None = None,
                      limit: int = 200) -> list[dict[str, Any]]:
        d = T.domain_events.c
        stmt = select(T.domain_events).order_by(d.recorded_at).limit(limit)
        if event_id is not None:
            stmt = stmt.where(d.event_id == event_id)
        if name is not None:
            stmt = stmt.where(d.name == name)
        if run_id is not None:
            stmt = stmt.where(d.run_id == run_id)
        with self.reading() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt).all()]
