"""The store's plumbing: transactions with work to do once they commit, insert-unless-present, and the lock
that holds one step while it runs."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from agentfleet.hooks.base import Hooks


def lock_id(key: str) -> int:
    """The Postgres advisory lock that holds the step with idempotency key ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


log = logging.getLogger(__name__)


class StoreBase:
    """What every kind of record shares: the engine, the hooks told of transitions, transactions."""

    def __init__(self, engine: Engine, *, hooks: Hooks | None = None, audit: bool = False) -> None:
        self.engine = engine
        self.hooks = hooks  # told of every transition, in its transaction and after it commits (hooks/base.py)
        self.audit = audit  # one ``audit`` row per transition, in the transition's transaction
        self.process = f"{socket.gethostname()}:{os.getpid()}"  # who moved a run outside any step
        self._after_commit: dict[int, list[Callable[[], None]]] = {}  # open tx() connection → what to run after
        self.dialect = engine.dialect.name
        self._local_locks: set[str] = set()
        self._local_guard = threading.Lock()

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """A transaction; what ``after_commit`` registered in it runs once it has committed."""
        pending: list[Callable[[], None]] = []
        with self.engine.begin() as conn:
            # Kept beside the connection, not in conn.info: reading that on a connection the database
            # dropped tries to reconnect and raises PendingRollbackError over the real (transient) error.
            self._after_commit[id(conn)] = pending
            try:
                yield conn
            finally:
                self._after_commit.pop(id(conn), None)
        for fn in pending:
            fn()

    def after_commit(self, conn: Connection, fn: Callable[[], None]) -> None:
        """Run ``fn`` once ``conn``'s transaction (opened by ``tx``) commits; outside ``tx``, now."""
        pending = self._after_commit.get(id(conn))
        if pending is None:
            fn()
        else:
            pending.append(fn)

    def _insert_ignore(self, conn: Connection, table: Any, values: dict[str, Any], keys: Sequence[str]) -> bool:
        """Insert unless a row with the same keys exists; True when this call inserted it."""
        dialect_insert = pg_insert if self.dialect == "postgresql" else sqlite_insert
        stmt = (
            dialect_insert(table)
            .values(**values)
            .on_conflict_do_nothing(index_elements=list(keys))
            .returning(*(table.c[k] for k in keys))
        )
        # RETURNING, not rowcount: psycopg 3 reports rowcount -1 for this statement.
        return conn.execute(stmt).first() is not None

    @contextmanager
    def step_lock(self, key: str) -> Iterator[bool]:
        """Exclusive hold on one step while it runs; released if this process dies.

        Postgres: a session advisory lock on its own connection (a killed worker's
        connection drops, and the lock with it). SQLite (one process): a local set.
        """
        if self.dialect != "postgresql":
            with self._local_guard:
                got = key not in self._local_locks
                if got:
                    self._local_locks.add(key)
            try:
                yield got
            finally:
                if got:
                    with self._local_guard:
                        self._local_locks.discard(key)
            return
        conn = self.engine.connect()
        got = False
        try:
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_id(key)}).scalar())
            conn.commit()
            yield got
        finally:
            try:
                if got:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_id(key)})
                    conn.commit()
            except Exception as exc:
                # Never hand a connection holding a lock back to the pool: closed, its session ends and
                # the lock with it. Not raised: it would replace what the step itself raised (an outcome
                # to carry through a database outage).
                conn.invalidate()
                log.warning("step lock released by closing its connection: %s", exc)
            finally:
                conn.close()
