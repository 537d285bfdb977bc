"""The store's plumbing: one connection per handling, transactions with work to do once they commit,
insert-unless-present, and the lock that holds one step while it runs."""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError

from agentfleet.hooks.base import Hooks
from agentfleet.store.sql import (
    POSTGRES,
    Later,
    Sql,
    defer,
    defer_script,
    discard,
    execute,
    execute_script,
    flush,
    sqlalchemy_error,
    undefer,
    watch,
)


def lock_id(key: str) -> int:
    """The Postgres advisory lock that holds the step with idempotency key ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


log = logging.getLogger(__name__)

MARK_CONSTRAINT = "pk_processed_events"


class AlreadyHandled(Exception):
    """The event this transaction marks handled was handled (committed) before: the transaction is rolled back, and
    what that earlier handling stored (``processed_outbox``) is what to publish."""


class RunMovedOn(Exception):
    """A run this transaction held as an earlier transaction read it, or as an event says it is (``Runs.hold_run``),
    was not so (or a call's result it took to be the first was not: ``Transcripts.record_first_observation``): the
    transaction is rolled back, nothing it wrote stays, and the caller reads the run again."""


RUN_MOVED_ON = "AF001"  # the SQLSTATE the check of a run held as read raises (migration 0020)


def mark_conflict(exc: IntegrityError) -> bool:
    """The error is the dedupe mark's primary key refusing a second handling of one event."""
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None) == MARK_CONSTRAINT


TRY_LOCK = Sql("SELECT pg_try_advisory_lock(:k)")
UNLOCK = Sql("SELECT pg_advisory_unlock(:k)")
# A transaction whose loss in a database crash costs nothing but a repeat: its WAL is flushed by the next
# durable commit (WAL is one sequence), and until then its message is not acked, so it is redelivered.
NOT_DURABLE = "SET LOCAL synchronous_commit TO OFF"
# The same, as an expression of a statement sent alone (a transaction of its own, where SET LOCAL is no statement to
# send with it): ``set_config`` with ``is_local`` holds until the transaction ends, which is when Postgres reads it.
# ``:relaxed`` false leaves the setting as it is.
RELAXED_IF = ("set_config('synchronous_commit', "
              "CASE WHEN :relaxed THEN 'off' ELSE current_setting('synchronous_commit') END, true)")


@dataclass
class _Handling:
    """The connection one handling of one event holds from its start to its end (``StoreBase.handling``)."""

    store: StoreBase
    conn: Connection
    thread: int
    in_tx: bool = False
    broken: bool = False
    locks: set[str] = field(default_factory=set)
    releasing: set[str] = field(default_factory=set)  # let go by the open transaction's COMMIT (``release_held``)

    def usable(self, store: StoreBase) -> bool:
        return (self.store is store and not self.in_tx and not self.broken and not self.conn.invalidated
                and self.thread == threading.get_ident())


def _autocommit(conn: Connection, on: bool) -> None:
    """Set the driver's autocommit, behind SQLAlchemy's back: its ``isolation_level="AUTOCOMMIT"`` option and the
    reset at checkin cost ~35 µs of CPU a handling, three an iteration, for the same one attribute of psycopg's
    connection. SQLAlchemy's own transactions on it behave alike either way (its BEGIN is the driver's, which sends
    none in autocommit; only its log lines differ). ``handling`` undoes it before the connection goes back to the
    pool, or drops the connection."""
    driver = conn.connection.driver_connection
    assert driver is not None
    driver.autocommit = on


class StepHold:
    """The answer of ``step_lock`` on a handling's connection: its ``pg_try_advisory_lock`` goes with the handling's
    next statement (one round trip fewer), and is read when the answer is asked for (``bool``), sending it alone if
    nothing went yet. A caller that asks after its first read writes nothing before: the step is not its own. One never
    asked for and never sent is dropped at the end, unsent: nothing taken, nothing to let go."""

    def __init__(self, key: str, bound: _Handling, later: Later) -> None:
        self.key, self.bound, self.later = key, bound, later
        self._taken: bool | None = None

    def taken(self, *, at_exit: bool = False) -> bool:
        if self._taken is None:
            later, conn = self.later, self.bound.conn
            if at_exit and not later.sent:  # never asked for, or dropped unsent by a rollback
                if not later.dropped and not conn.invalidated:
                    discard(conn)  # no transaction is open now: the lock is all that waits
                self._taken = False
            else:
                self._taken = not later.dropped and bool(later.rows().scalar())
            if self._taken:
                self.bound.locks.add(self.key)
        return self._taken

    def __bool__(self) -> bool:
        return self.taken()

    @property
    def pending(self) -> bool:
        """Not asked yet: its try waits, unsent, for the handling's next statement."""
        return self._taken is None and not self.later.sent and not self.later.dropped

    def forgo(self) -> None:
        """Not wanted after all (a step run with no holder, ``roles/executor.py``): the lone try, not sent yet, is
        taken back; nothing is taken, and nothing is let go at the end."""
        if self._taken is None and undefer(self.bound.conn, self.later):
            self._taken = False

    def ask_again(self) -> None:
        """After a transaction that asked for the lock in its own statement (``ask_with``) failed before that statement
        answered: nothing was taken, and the lone try waits again for the handling's next statement."""
        if self._taken is None and self.later.dropped:
            self.later = defer(self.bound.conn, TRY_LOCK, {"k": lock_id(self.key)}, keep=True)

    def ask_with(self, conn: Connection, stmt: Sql, values: Mapping[str, Any]) -> Later | None:
        """Ask for the lock with ``stmt`` instead (on the handling's connection, in the transaction open there),
        whose first column is the answer and whose write is made only when the lock was taken: the intent of a
        step and its lock in one statement. None when the lone try has gone already (its answer stands)."""
        if self._taken is not None or conn is not self.bound.conn or not undefer(conn, self.later):
            return None
        self.later = defer(conn, stmt, values, keep=True)
        return self.later

    def ask_alone(self, stmt: Sql, values: Mapping[str, Any]) -> Later | None:
        """``ask_with``, outside any transaction: ``stmt`` is sent now, alone, in a transaction of its own (the
        handling's connection is in autocommit), and answered. Anything else deferred on the connection goes first,
        in a round trip of its own: nothing rides in a transaction ``stmt`` may relax. None when the lone try has
        gone already, or a transaction is open.

        A statement that fails may have taken the lock before it failed (cancelled while its write waits on a row,
        say), and a session's advisory lock outlives the statement: it then counts as taken, and ``step_lock`` lets
        go of it at the end (an unlock of a lock not held changes nothing)."""
        if self._taken is not None or self.bound.in_tx or not undefer(self.bound.conn, self.later):
            return None
        flush(self.bound.conn)
        self.later = defer(self.bound.conn, stmt, values, keep=True)
        try:
            self.later.rows()
        except BaseException:
            self._taken = True
            self.bound.locks.add(self.key)
            raise
        return self.later


@dataclass
class _OpenTx:
    """What a transaction opened by ``StoreBase.tx`` keeps until it ends."""

    after_commit: list[Callable[[], None]] = field(default_factory=list)
    # Runs whose rows this transaction holds (read FOR UPDATE, created or moved by it), by the version it holds:
    # a compare-and-set on one of them cannot miss, so it need not wait for its answer (``Runs.transition``).
    held_runs: dict[str, int] = field(default_factory=dict)
    # Moves of held runs deferred and not sent yet, by run (``Runs.transition``: a second move of one joins it).
    moves: dict[str, Any] = field(default_factory=dict)


_handling: contextvars.ContextVar[_Handling | None] = contextvars.ContextVar("agentfleet_handling", default=None)


class StoreBase:
    """What every kind of record shares: the engine, the hooks told of transitions, transactions."""

    def __init__(self, engine: Engine, *, hooks: Hooks | None = None, audit: bool = False) -> None:
        self.engine = engine
        self.hooks = hooks  # told of every transition, in its transaction and after it commits (hooks/base.py)
        self.audit = audit  # one ``audit`` row per transition, in the transition's transaction
        self.process = f"{socket.gethostname()}:{os.getpid()}"  # who moved a run outside any step
        self._open: dict[int, _OpenTx] = {}  # open tx() connection → what it keeps until it ends
        self.dialect = engine.dialect.name
        self._local_locks: set[str] = set()
        self._local_guard = threading.Lock()
        watch(engine)  # SQLAlchemy's statements keep their place among the deferred ones

    @contextmanager
    def handling(self) -> Iterator[None]:
        """Hold one pooled connection for a whole handling: its transactions, its reads and its step lock.

        A handling used to check a connection out (and ping it) for every transaction and read, about twenty
        an iteration. The connection is in autocommit: a read is one statement, no BEGIN or ROLLBACK around it,
        and ``tx`` sends its own BEGIN and COMMIT. Anything asked for while one of its transactions is open (a
        read that must not see it, a second transaction) gets a connection of its own, as before.

        Postgres only: SQLite runs in the process (a round trip costs nothing), and its driver's autocommit and
        SQLAlchemy's reset of a returned connection's isolation level do not mix with its ``BEGIN IMMEDIATE``.
        """
        if _handling.get() is not None or self.dialect != POSTGRES:
            yield
            return
        conn = self.engine.connect()
        try:
            _autocommit(conn, True)
        except conn.dialect.loaded_dbapi.Error as exc:  # closed under the pool: as every lost connection fails a step
            error = sqlalchemy_error(conn, exc, "SET autocommit", None, lost=True)  # invalidated: retried elsewhere
            conn.close()
            raise error from exc
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        bound = _Handling(self, conn, threading.get_ident())
        token = _handling.set(bound)
        try:
            yield
        finally:
            _handling.reset(token)
            if not conn.invalidated and (left := discard(conn)):  # a bug: nothing is deferred outside a tx
                log.error("a handling ended with statements still deferred; dropped", extra={"statements": left})
            if bound.locks or bound.releasing:  # a lock left held must not go back to the pool with its connection
                conn.invalidate()
            if not conn.invalidated:
                try:
                    _autocommit(conn, False)
                except Exception as exc:  # still in a transaction (a bug), or the connection is gone
                    log.warning("a handling's connection could not leave autocommit; dropped: %s", exc)
                    conn.invalidate()
            conn.close()

    def _bound(self) -> _Handling | None:
        bound = _handling.get()
        return bound if bound is not None and bound.usable(self) else None

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection for reads that stand alone: the handling's, when no transaction is open on it; else one of
        its own, in autocommit on Postgres (no BEGIN and ROLLBACK around a read; a ROLLBACK also makes psycopg
        drop every statement it had prepared on that connection)."""
        bound = self._bound()
        if bound is not None:
            yield bound.conn
            return
        with self.engine.connect() as conn:
            if self.dialect == POSTGRES:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    def relax(self, conn: Connection) -> None:
        """This transaction's commit need not wait for the disk (Postgres; any time before it commits).

        Only for writes whose loss in a database crash repeats work and loses nothing else (an intent before a
        model call or a repeatable tool call, a run's start that its handling goes on to plan): a later durable
        commit flushes them anyway (the WAL is one sequence), and the message that caused them is not acked before
        one.
        """
        if self.dialect == POSTGRES:
            defer_script(conn, NOT_DURABLE)

    @contextmanager
    def tx(self, *, durable: bool = True) -> Iterator[Connection]:
        """A transaction; what ``after_commit`` registered in it runs once it has committed.

        ``durable=False``: ``relax`` it from the start. A handling's transaction sends its BEGIN with its first
        statement and its deferred writes with its COMMIT (``store.sql.defer``). A second handling of an event
        already handled is found when its dedupe mark is written: ``AlreadyHandled``, and nothing it wrote stays.
        """
        opened = _OpenTx()
        bound = self._bound()
        try:
            if bound is None:
                with self.engine.begin() as conn:
                    # Kept beside the connection, not in conn.info: reading that on a connection the database
                    # dropped tries to reconnect and raises PendingRollbackError over the real (transient) error.
                    self._open[id(conn)] = opened
                    try:
                        if not durable:
                            self.relax(conn)
                        yield conn
                    finally:
                        self._open.pop(id(conn), None)
            else:
                conn = bound.conn
                bound.in_tx = True
                self._open[id(conn)] = opened
                try:
                    defer_script(conn, "BEGIN")
                    if not durable:
                        self.relax(conn)
                    try:
                        yield conn
                    except BaseException:
                        self._rollback(bound)
                        raise
                    try:
                        execute_script(conn, "COMMIT")
                    except BaseException:
                        self._rollback(bound)
                        raise
                    bound.releasing.clear()  # their unlocks went with the COMMIT
                finally:
                    self._open.pop(id(conn), None)
                    bound.in_tx = False
                    bound.locks |= bound.releasing  # not committed: still held, for step_lock to let go
                    bound.releasing.clear()
        except IntegrityError as exc:
            if mark_conflict(exc):
                raise AlreadyHandled() from exc
            raise
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == RUN_MOVED_ON:
                raise RunMovedOn(str(exc.orig)) from exc
            raise
        for fn in opened.after_commit:
            fn()

    def _rollback(self, bound: _Handling) -> None:
        """End a failed transaction on the handling's connection; a connection that cannot is not used again.
        A transaction that had sent nothing yet (its BEGIN still deferred) is simply dropped."""
        if bound.conn.invalidated:
            bound.broken = True
            return
        if "BEGIN" in discard(bound.conn):
            return
        try:
            execute_script(bound.conn, "ROLLBACK")
        except Exception as exc:
            bound.broken = True
            log.warning("could not roll back on the handling's connection: %s", exc)

    def after_commit(self, conn: Connection, fn: Callable[[], None]) -> None:
        """Run ``fn`` once ``conn``'s transaction (opened by ``tx``) commits; outside ``tx``, now."""
        opened = self._open.get(id(conn))
        if opened is None:
            fn()
        else:
            opened.after_commit.append(fn)

    def in_tx(self, conn: Connection) -> bool:
        """``conn`` is in a transaction opened by ``tx`` that has not ended."""
        return id(conn) in self._open

    def _moves(self, conn: Connection) -> dict[str, Any]:
        """The deferred moves of ``conn``'s open transaction not yet sent, by run (empty outside ``tx``)."""
        opened = self._open.get(id(conn))
        return {} if opened is None else opened.moves

    def _held_runs(self, conn: Connection) -> dict[str, int] | None:
        """The runs ``conn``'s open transaction (opened by ``tx``) holds, by version, to read and add to; None outside
        ``tx``."""
        opened = self._open.get(id(conn))
        return None if opened is None else opened.held_runs

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
    def step_lock(self, key: str, *, own_connection: bool = False) -> Iterator[bool | StepHold]:
        """Exclusive hold on one step while it runs; released if this process dies.

        Postgres: a session advisory lock, on the handling's connection when there is one (a killed worker's
        connection drops, and the lock with it), else on a connection of its own. ``own_connection``: always
        its own (a session's advisory locks are re-entrant: asking whether a step is held must not ask the
        holder's own session). SQLite (one process): a local set. What it yields is true when the step is this
        handling's: on a handling's connection that is asked with its next statement (``StepHold``).
        """
        if self.dialect != POSTGRES:
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
        bound = None if own_connection else self._bound()
        if bound is not None and key not in bound.locks:
            hold = StepHold(key, bound, defer(bound.conn, TRY_LOCK, {"k": lock_id(key)}, keep=True))
            try:
                yield hold
            finally:
                if hold.taken(at_exit=True) and key in bound.locks:  # not let go of already by a COMMIT
                    self._unlock(bound.conn, key, bound)
            return
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        got = False
        try:
            got = bool(execute(conn, TRY_LOCK, {"k": lock_id(key)}).scalar())
            yield got
        finally:
            try:
                if got:
                    self._unlock(conn, key, None)
            finally:
                conn.close()

    def release_held(self, conn: Connection) -> None:
        """Let go of the step locks this handling holds as its open transaction on ``conn`` commits: the unlock goes
        with the COMMIT (one round trip fewer than after it). Safe before the COMMIT itself: whoever takes the lock
        in between must then touch a row this transaction holds (the run's row, the step's) and waits for it to
        commit, and sees the outcome. If the transaction does not commit, the locks are still held and
        ``step_lock`` lets go of them as it always did (an unlock of a lock not held is a no-op)."""
        bound = _handling.get()
        if bound is None or bound.store is not self or bound.conn is not conn or not bound.in_tx:
            return
        for key in bound.locks:
            defer(conn, UNLOCK, {"k": lock_id(key)})
        bound.releasing |= bound.locks
        bound.locks.clear()

    def _unlock(self, conn: Connection, key: str, bound: _Handling | None) -> None:
        if conn.closed:  # the handling ended first and closed its connection: the session, and the lock, are gone
            if bound is not None:
                bound.locks.discard(key)
            return
        try:
            if conn.invalidated or (bound is not None and bound.in_tx):
                raise RuntimeError("the connection holding the lock is in no state to release it")
            execute(conn, UNLOCK, {"k": lock_id(key)})
            if bound is not None:
                bound.locks.discard(key)
        except Exception as exc:
            # Never hand a connection holding a lock back to the pool: closed, its session ends and
            # the lock with it. Not raised: it would replace what the step itself raised (an outcome
            # to carry through a database outage).
            if not conn.invalidated:
                conn.invalidate()
            if bound is not None:
                bound.broken = True
                bound.locks.discard(key)
            log.warning("step lock released by closing its connection: %s", exc)
