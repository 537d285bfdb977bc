"""Threads: the runs of one conversation, one at a time, each starting from what the earlier ones left.

Nothing is copied from run to run: a thread is its runs, and what an earlier run left (its goal and its answer)
is read from that run's own row when a later one plans. A thread's storage grows with its messages, not with
runs × messages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from agentfleet.loop.states import RunState
from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import RunRecord, now
from agentfleet.store.sql import POSTGRES

THREAD_LOOKBACK = 50  # earlier runs of a thread a plan reads at most (the context keeps what fits of them)
THREADS_KEPT = 64  # runs whose thread's past a process keeps: read once a run, not once an iteration
THREAD_LIVE_SCAN = 1000  # live runs of one thread read to find whose turn it is


class Threads(StoreBase):
    """A thread's turn, and what its earlier runs left."""

    def hold_thread(self, conn: Connection, thread_id: str, *, place: bool = False) -> int | None:
        """Create the thread if new and lock its row for ``conn``'s transaction: runs starting and ending on it are
        serialized, so one of them always sees the other (no run waits for a turn nobody gives). ``place``: give
        out the thread's next place (``thread_seq``) and return it; places given under this lock are the order
        the thread's runs take turns in, whatever their clocks say."""
        insert = pg_insert if self.dialect == POSTGRES else sqlite_insert
        at, step = now(), 1 if place else 0
        t = T.threads.c
        stmt = (insert(T.threads).values(thread_id=thread_id, runs=step, created_at=at, updated_at=at)
                .on_conflict_do_update(index_elements=["thread_id"], set_={"updated_at": at, "runs": t.runs + step})
                .returning(t.runs))
        given = int(conn.execute(stmt).scalar_one())
        return given if place else None

    def place_on_thread(self, conn: Connection, run: RunRecord) -> RunRecord:
        """``run`` with its place in its thread (given now if it has none), the thread's row held."""
        assert run.thread_id is not None
        seq = self.hold_thread(conn, run.thread_id, place=run.thread_seq is None)
        if seq is None:
            return run
        conn.execute(update(T.runs).where(T.runs.c.run_id == run.run_id).values(thread_seq=seq))
        return run.replace(thread_seq=seq)

    def thread_turn(self, conn: Connection, thread_id: str) -> RunRecord | None:
        """Whose turn it is on the thread: its run going now (started, not ended), else its pending run with the
        first place (which may start now), else None."""
        r = T.runs.c
        rows = conn.execute(select(T.runs).where(r.thread_id == thread_id, T.LIVE_SQL)
                            .order_by(r.thread_seq).limit(THREAD_LIVE_SCAN)).all()
        live = [RunRecord.from_row(row) for row in rows]
        going = [run for run in live if run.state != RunState.PENDING]
        if going:
            return going[0]
        placed = [run for run in live if run.thread_seq is not None]
        return placed[0] if placed else None

    def waits_for_thread(self, run: RunRecord) -> bool:
        """A run of a thread whose turn it is not: another run of the thread is going, or placed before it."""
        if run.thread_id is None:
            return False
        with self.reading() as conn:
            turn = self.thread_turn(conn, run.thread_id)
        return turn is not None and turn.run_id != run.run_id

    def _thread_pasts(self) -> tuple[OrderedDict[str, list[dict[str, Any]]], threading.Lock]:
        """This store's cache of what each thread run was shown of its thread's past, and its lock."""
        found = self.__dict__.get("_thread_past_cache")
        if found is None:
            found = self.__dict__.setdefault("_thread_past_cache", (OrderedDict(), threading.Lock()))
        return found  # type: ignore[no-any-return]

    def thread_before(self, run: RunRecord, limit: int = THREAD_LOOKBACK) -> list[dict[str, Any]]:
        """What the thread's ended runs of ``run``'s agent placed before it left, in order (the last ``limit``):
        each one's run id, goal input, status and output or error. Another agent naming the same thread takes its
        turn in the same order but reads none of it: a thread id is not a way into another agent's answers."""
        if run.thread_id is None or run.thread_seq is None:
            return []
        cache, guard = self._thread_pasts()
        kept = cache.get(run.run_id)  # ended runs placed before this one: they never change again
        if kept is not None:
            return kept
        r = T.runs.c
        stmt = (select(r.run_id, r.input, r.result, r.state)
                .where(r.thread_id == run.thread_id, r.agent == run.agent, T.ENDED_SQL,
                       r.thread_seq < run.thread_seq)
                .order_by(r.thread_seq.desc()).limit(limit))
        with self.reading() as conn:
            rows = conn.execute(stmt).all()
        found = [{"run_id": row[0], "input": row[1], "result": row[2] or {}, "state": row[3]} for row in reversed(rows)]
        with guard:
            cache[run.run_id] = found
            while len(cache) > THREADS_KEPT:
                cache.popitem(last=False)
        return found

    def threads_page(self, limit: int, before: datetime | None = None) -> list[dict[str, Any]]:
        """Threads, most recently active first: id, when started and last active, and how many runs."""
        t, r = T.threads.c, T.runs.c
        runs = select(func.count()).where(r.thread_id == t.thread_id).scalar_subquery()
        stmt = select(t.thread_id, t.created_at, t.updated_at, runs.label("runs"))
        if before is not None:
            stmt = stmt.where(t.updated_at < before)
        with self.reading() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt.order_by(t.updated_at.desc()).limit(limit))]

    def thread_runs(self, thread_id: str, limit: int = 1000) -> list[RunRecord]:
        """A thread's runs, oldest first."""
        r = T.runs.c
        with self.reading() as conn:
            rows = conn.execute(select(T.runs).where(r.thread_id == thread_id)
                                .order_by(r.thread_seq, r.created_at).limit(limit)).all()
        return [RunRecord.from_row(row) for row in rows]
