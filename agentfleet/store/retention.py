"""Retention's queries: ended runs past their keeping time, and deleting them with everything that hangs off them.

Each query reads through an index of its own (migration 0014), and each deletion is one short transaction over a
batch of runs, so pruning a million ended runs holds no lock the hot path waits on for longer than one batch, and
costs a batch what the batch holds, not what the database holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Table, and_, delete, exists, func, or_, select, text, tuple_

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.sql import POSTGRES

FREED = "freed_bytes"  # not a table: what the deleted rows took (Postgres)
# What hangs off a run, by its run_id column: deleted with the run, before it.
RUN_TABLES: tuple[Table, ...] = (T.steps, T.messages, T.observations, T.processed_events, T.run_replies, T.audit,
                                 T.approvals, T.domain_events, T.run_artifacts)


class Retention(StoreBase):
    """What ``ops.retention`` deletes, a batch at a time."""

    def prunable_runs(self, before: datetime, *, agents: Sequence[str] | None = None, other_than: Sequence[str] = (),
                      after: tuple[datetime, str] | None = None, limit: int) -> list[tuple[str, datetime]]:
        """Ended runs last changed before ``before`` (of ``agents`` if given, of no agent in ``other_than``), oldest
        first, ``after`` the last one seen: (run_id, updated_at).

        Kept whatever their age: a run that still owes a Result to a reply_to, one with a child still running
        (its answer is on its way), one whose parent still runs (the parent may yet read it in its tree), and one
        a live retry or fork starts from (it reads its transcript)."""
        r = T.runs.c
        child, parent, heir = T.runs.alias("child"), T.runs.alias("parent"), T.runs.alias("heir")
        replies = T.run_replies.c
        where: list[ColumnElement[bool]] = [
            T.ENDED_SQL, r.updated_at < before,
            ~exists().where(replies.run_id == r.run_id, replies.delivered_at.is_(None)),
            ~exists().where(child.c.parent_run_id == r.run_id, child.c.state.not_in(list(T.ENDED))),
            ~exists().where(parent.c.run_id == r.parent_run_id, parent.c.state.not_in(list(T.ENDED))),
            ~exists().where(heir.c.lineage_run_id == r.run_id, heir.c.state.not_in(list(T.ENDED))),
        ]
        if agents is not None:
            where.append(r.agent.in_(list(agents)))
        if other_than:
            where.append(r.agent.not_in(list(other_than)))
        if after is not None:
            where.append(or_(r.updated_at > after[0], and_(r.updated_at == after[0], r.run_id > after[1])))
        stmt = select(r.run_id, r.updated_at).where(*where).order_by(r.updated_at, r.run_id).limit(limit)
        with self.reading() as conn:
            return [(row[0], row[1]) for row in conn.execute(stmt).all()]

    def rows_of_runs(self, run_ids: Sequence[str]) -> dict[str, int]:
        """How many rows each table holds for these runs (what deleting them would delete): a dry run's count."""
        ids = list(run_ids)
        counts: dict[str, int] = {}
        with self.reading() as conn:
            for table in RUN_TABLES:
                counts[table.name] = int(conn.execute(
                    select(func.count()).select_from(table).where(table.c.run_id.in_(ids))).scalar() or 0)
        counts["runs"] = len(ids)
        return counts

    def delete_runs(self, run_ids: Sequence[str]) -> dict[str, int]:
        """Delete these ended runs and every row that hangs off them, in one transaction; rows deleted per table
        (and, on Postgres, the bytes those rows took under ``FREED``: space new rows reuse; the file shrinks only
        with ``VACUUM FULL``). A run that is not ended (it cannot be: ended is final) is left with all of its rows."""
        ids = list(run_ids)
        counts: dict[str, int] = {}
        with self.tx() as conn:
            ended = select(T.runs.c.run_id).where(T.runs.c.run_id.in_(ids), T.ENDED_SQL)
            if self.dialect == POSTGRES:
                ended = ended.with_for_update()  # the rows stay as read until they are gone
            ids = list(conn.execute(ended).scalars())
            freed = 0
            for table in (*RUN_TABLES, T.runs):
                if self.dialect == POSTGRES:  # what each deleted row took, told by the DELETE itself
                    sizes = conn.execute(text(f"DELETE FROM {table.name} t WHERE t.run_id = ANY(:ids) "
                                              "RETURNING pg_column_size(t.*)"), {"ids": ids}).scalars().all()
                    counts[table.name], freed = len(sizes), freed + sum(sizes)
                else:
                    counts[table.name] = _deleted(conn, delete(table).where(table.c.run_id.in_(ids)))
            if self.dialect == POSTGRES:
                counts[FREED] = freed
        return counts

    def orphan_artifacts(self, before: datetime, limit: int) -> list[str]:
        """Artifacts no run links to any more, last produced before ``before``."""
        a, linked = T.artifacts.c, T.run_artifacts.c
        stmt = (select(a.ref).where(a.created_at < before, ~exists().where(linked.ref == a.ref))
                .order_by(a.ref).limit(limit))
        with self.reading() as conn:
            return list(conn.execute(stmt).scalars())

    def delete_artifacts(self, refs: Sequence[str], before: datetime) -> dict[str, int]:
        """Delete these artifacts (and their chunks) if they are still unlinked and still last produced before
        ``before``. A call that produces one again meanwhile touches its ``created_at`` first (``keep_artifacts``),
        under the row's lock, so this either deletes it before that call (which then stores it anew) or finds it
        fresh and leaves it."""
        a, linked = T.artifacts.c, T.run_artifacts.c
        with self.tx() as conn:
            gone = list(conn.execute(
                delete(T.artifacts).where(a.ref.in_(list(refs)), a.created_at < before,
                                          ~exists().where(linked.ref == a.ref)).returning(a.ref)).scalars())
            chunks = _deleted(conn, delete(T.artifact_chunks).where(T.artifact_chunks.c.ref.in_(gone))) if gone else 0
        return {"artifacts": len(gone), "artifact_chunks": chunks}

    def delete_history(self, before: datetime, limit: int) -> dict[str, int]:
        """Up to ``limit`` rows each of what belongs to no run and is older than ``before``: tool health changes,
        dedupe marks of events that named no run, domain events from outside (their event ids stop deduping:
        the same message published again after this starts its triggered runs again), and threads with no run
        left."""
        counts: dict[str, int] = {}
        with self.tx() as conn:
            for table, keys, old in _history(before):
                some = select(*keys).where(*old).limit(limit).subquery()
                counts[table.name] = _deleted(conn, delete(table).where(
                    tuple_(*keys).in_(select(*(some.c[k.name] for k in keys)))))
        return counts

    def count_history(self, before: datetime) -> dict[str, int]:
        """How many rows ``delete_history`` would delete in all (a dry run)."""
        with self.reading() as conn:
            return {table.name: int(conn.execute(select(func.count()).select_from(table).where(*old)).scalar() or 0)
                    for table, _, old in _history(before)}

    def database_bytes(self) -> int | None:
        """The database's size on disk: Postgres's own figure; SQLite's pages in use (its file does not shrink
        without VACUUM, so what a prune frees shows here, not in the file's size)."""
        with self.reading() as conn:
            if self.dialect == POSTGRES:
                return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0)
            pages = int(conn.execute(text("PRAGMA page_count")).scalar() or 0)
            free = int(conn.execute(text("PRAGMA freelist_count")).scalar() or 0)
            size = int(conn.execute(text("PRAGMA page_size")).scalar() or 0)
            return (pages - free) * size


def _deleted(conn: Connection, stmt: object) -> int:
    result = conn.execute(stmt)  # type: ignore[call-overload]
    return max(int(result.rowcount or 0), 0)


def _history(before: datetime) -> list[tuple[Table, list[ColumnElement[Any]], list[ColumnElement[bool]]]]:
    """What belongs to no run, by table: its key columns and what makes a row old (each through an index); a
    thread whose runs are all gone is forgotten too."""
    health, marks, domain = T.tool_health_events.c, T.processed_events.c, T.domain_events.c
    return [
        (T.tool_health_events, [health.event_id], [health.occurred_at < before]),
        (T.processed_events, [marks.event_id, marks.consumer], [marks.run_id.is_(None), marks.processed_at < before]),
        (T.domain_events, [domain.event_id], [domain.run_id.is_(None), domain.recorded_at < before]),
        (T.threads, [T.threads.c.thread_id], [T.threads.c.updated_at < before,
                                              ~exists().where(T.runs.c.thread_id == T.threads.c.thread_id)]),
    ]
