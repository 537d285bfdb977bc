"""Schedules: their rows, the due ones taken one scheduler at a time, and their next tick moved on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.exc import IntegrityError

from agentfleet.errors import ConfigurationError
from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import as_utc, now
from agentfleet.store.sql import POSTGRES, Sql, execute

# Asked every ``schedule_poll_s`` in every observer, most often of no schedule at all: built once.
_ANY_DUE = Sql("SELECT schedule_id FROM schedules WHERE NOT paused AND next_at <= :at LIMIT 1", times=frozenset({"at"}))


def _row(row: Any) -> dict[str, Any]:
    found = dict(row._mapping)
    for key in ("anchor", "next_at", "last_fired_at", "created_at", "updated_at"):
        found[key] = as_utc(found[key])
    return found


class Schedules(StoreBase):
    """Schedules, by id."""

    def add_schedule(self, values: dict[str, Any]) -> dict[str, Any]:
        at = now()
        row = {**values, "paused": values.get("paused", False), "fired": 0, "skipped": 0, "created_at": at,
               "updated_at": at}
        try:
            with self.tx() as conn:
                conn.execute(T.schedules.insert().values(**row))
        except IntegrityError:
            raise ConfigurationError(f"a schedule named {values['schedule_id']!r} exists (delete it first)") from None
        found = self.schedule(values["schedule_id"])
        assert found is not None
        return found

    def schedule(self, schedule_id: str) -> dict[str, Any] | None:
        with self.reading() as conn:
            row = conn.execute(select(T.schedules).where(T.schedules.c.schedule_id == schedule_id)).first()
        return _row(row) if row is not None else None

    def schedules_list(self) -> list[dict[str, Any]]:
        with self.reading() as conn:
            return [_row(r) for r in conn.execute(select(T.schedules).order_by(T.schedules.c.schedule_id))]

    def set_schedule(self, schedule_id: str, **values: Any) -> bool:
        """Change a schedule's fields (pause, resume with its next tick); False when there is none."""
        with self.tx() as conn:
            done = conn.execute(update(T.schedules).where(T.schedules.c.schedule_id == schedule_id)
                                .values(**values, updated_at=now()))
        return bool(done.rowcount)

    def delete_schedule(self, schedule_id: str) -> bool:
        with self.tx() as conn:
            done = conn.execute(delete(T.schedules).where(T.schedules.c.schedule_id == schedule_id))
        return bool(done.rowcount)

    @contextmanager
    def due_schedules(self, at: datetime, limit: int) -> Iterator[tuple[Connection | None, list[dict[str, Any]]]]:
        """Active schedules whose next tick is at or before ``at``, each row held for the transaction: another
        scheduler skips them (Postgres ``SKIP LOCKED``) instead of waiting or firing them too. The rows stay held
        while the caller fires them and moves them on (``advance``), and are let go when the transaction ends."""
        with self.reading() as conn:  # most passes find nothing: a read, no transaction (nor SQLite's write lock)
            anything = execute(conn, _ANY_DUE, {"at": at}).first()
        if anything is None:
            yield None, []  # type: ignore[misc]
            return
        s = T.schedules.c
        stmt = select(T.schedules).where(~s.paused, s.next_at <= at).order_by(s.next_at).limit(limit)
        if self.dialect == POSTGRES:
            stmt = stmt.with_for_update(skip_locked=True)
        with self.tx() as conn:
            yield conn, [_row(r) for r in conn.execute(stmt)]

    @staticmethod
    def advance(conn: Connection, schedule_id: str, *, next_at: datetime, fired: int, skipped: int,
                last_goal_id: str | None) -> None:
        s = T.schedules.c
        values: dict[str, Any] = {"next_at": next_at, "fired": s.fired + fired, "skipped": s.skipped + skipped,
                                  "updated_at": now()}
        if fired:
            values.update(last_fired_at=now(), last_goal_id=last_goal_id)
        conn.execute(update(T.schedules).where(s.schedule_id == schedule_id).values(**values))
