"""Dedupe and outbox: each handled event's mark with the events it produced, and who waits for a run's Result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import now
from agentfleet.store.sql import POSTGRES, Json, Sql, defer, execute

MARK = Sql("INSERT INTO processed_events (event_id, consumer, outbox, processed_at, run_id) "
           "VALUES (:event_id, :consumer, :outbox, :at, :run_id) "
           "ON CONFLICT (event_id, consumer) DO NOTHING RETURNING event_id",
           json=frozenset({"outbox"}), times=frozenset({"at"}))
# The same mark as a plain INSERT: deferred to the handling's COMMIT, where a second handling of one event fails on
# the primary key and its whole transaction with it (``StoreBase.tx`` raises AlreadyHandled).
MARK_ONCE = Sql("INSERT INTO processed_events (event_id, consumer, outbox, processed_at, run_id) "
                "VALUES (:event_id, :consumer, :outbox, :at, :run_id)",
                json=frozenset({"outbox"}), times=frozenset({"at"}))
STORED = Sql("SELECT outbox FROM processed_events WHERE event_id = :event_id AND consumer = :consumer",
             result=("json",))
# Who still waits for a run's Result: read at every run's end (the observer), as a prepared statement.
OWED = Sql("SELECT id, reply_to, correlation_id FROM run_replies WHERE run_id = :run_id AND delivered_at IS NULL "
           "ORDER BY id")
# A reply sent: deferred to the end's COMMIT, one statement a reply (a run's end owes one or two).
REPLIED = Sql("UPDATE run_replies SET delivered_at = :at WHERE id = :id", times=frozenset({"at"}))


class Outbox(StoreBase):
    """Dedupe marks with their outboxes, and reply targets."""

    def processed_outbox(self, event_id: str, consumer: str, conn: Connection | None = None
                         ) -> list[dict[str, Any]] | None:
        """What the handling of ``event_id`` by ``consumer`` produced, or None: not handled (committed) yet."""
        if conn is not None:
            row = execute(conn, STORED, {"event_id": event_id, "consumer": consumer}).first()
        else:
            with self.reading() as own:
                row = execute(own, STORED, {"event_id": event_id, "consumer": consumer}).first()
        return None if row is None else list(row[0])

    def mark_processed(self, conn: Connection, event_id: str, consumer: str,
                       outbox: list[dict[str, Any]] | str, run_id: str | None = None, *,
                       deferred: bool = False) -> bool:
        """The dedupe mark, with the events this handling produced (as dicts, or as the JSON array
        ``events.envelope.stored_outbox`` encoded, stored as it is); False: the event was handled already (the insert
        is the check: the stored outbox is read only then, ``processed_outbox``).

        ``deferred`` (Postgres): sent with the transaction's COMMIT, which fails with ``AlreadyHandled`` if the
        event was handled before (True here means only "sent").
        """
        if isinstance(outbox, str):
            outbox = Json(outbox)
        values = {"event_id": event_id, "consumer": consumer, "outbox": outbox, "at": now(), "run_id": run_id}
        if deferred and self.dialect == POSTGRES:
            defer(conn, MARK_ONCE, values)
            return True
        return execute(conn, MARK, values).first() is not None

    def stored_events(self, run_id: str) -> list[dict[str, Any]]:
        """Every event the run's handled steps produced (their stored outboxes), oldest first."""
        with self.reading() as conn:
            rows = conn.execute(
                select(T.processed_events.c.outbox).where(T.processed_events.c.run_id == run_id)
                .order_by(T.processed_events.c.processed_at)
            ).scalars().all()
        return [event for outbox in rows for event in outbox]

    def add_reply(self, conn: Connection, run_id: str, reply_to: str, correlation_id: str | None) -> None:
        self._insert_ignore(
            conn, T.run_replies,
            dict(run_id=run_id, reply_to=reply_to, correlation_id=correlation_id or ""),
            ["run_id", "reply_to", "correlation_id"],
        )

    def pending_replies(self, run_id: str) -> list[tuple[int, str, str]]:
        """The replies a run's Result still owes: id, reply_to, correlation_id, oldest first."""
        with self.reading() as conn:
            return [(int(r[0]), str(r[1]), str(r[2])) for r in execute(conn, OWED, {"run_id": run_id}).rows]

    def mark_replied(self, conn: Connection, ids: Sequence[int]) -> None:
        """The replies ``ids`` sent, with the transaction's next round trip (its COMMIT)."""
        at = now()
        for reply_id in ids:
            defer(conn, REPLIED, {"id": reply_id, "at": at})
