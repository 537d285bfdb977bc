"""The statements every iteration runs: written once, rendered once per dialect, run on the driver's own cursor.

SQLAlchemy Core builds, caches and post-processes each execution: measured here, an ``INSERT … ON CONFLICT DO
NOTHING RETURNING`` built per call costs 217 µs of CPU, prebuilt 105 µs, and the same text on psycopg's cursor
(prepared on the server after its first run) 55 µs; an iteration runs a few dozen of them. The statements here
are the hot path's; everything else stays SQLAlchemy Core. Both run on the same connection, so they mix in one
transaction: a statement here goes to the DBAPI connection under the SQLAlchemy ``Connection`` it is given,
inside whatever transaction that connection is in.

One text serves Postgres and SQLite: ``:name`` parameters (psycopg gets ``%(name)s``), ``{for_update}`` where
Postgres locks the rows read (SQLite has one writer anyway). Values are converted as SQLAlchemy's column types
would: JSON as text (Postgres casts it; SQLite keeps it), timestamps in the text form SQLAlchemy's SQLite
``DateTime`` reads back, so rows written here read the same through Core and the other way round.

A driver error is raised as SQLAlchemy's wrapped error (``DBAPIError`` and its subclasses), with the connection
invalidated when it was a disconnect, so retries decide on one kind of error whichever path raised it.

Round trips. On Postgres a statement whose result nobody reads (a write checked by its constraints, BEGIN,
``SET LOCAL``) can be deferred: it is queued on the connection and sent, in psycopg's pipeline mode, with the next
statement that is executed or with the COMMIT, in one round trip (seven statements of a transaction one by one
cost 338 µs of CPU and 721 µs of wall time here, pipelined 157 and 198). Nothing queued is ever lost or reordered:
SQLAlchemy's own statements and commits send the queue first (``watch``), a rollback discards it, and a connection
goes back to the pool with nothing queued. A deferred statement's error is raised by the statement it went with.
"""

from __future__ import annotations

import json
import logging
import os
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal, overload

from sqlalchemy import JSON, Boolean, Connection, DateTime, Engine, Table, event
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

_PARAM = re.compile(r"(?<![:\w]):(\w+)")
LOST_PREPARED = "26000"  # invalid_sql_statement_name: "prepared statement … does not exist"
POSTGRES, SQLITE = "postgresql", "sqlite"


def _sqlite_time(value: datetime) -> str:
    """What SQLAlchemy's SQLite ``DateTime`` stores: UTC, no zone, always six digits of microseconds."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


def _utc(value: Any) -> Any:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


# How a result column comes back from each driver, by kind: Postgres decodes JSON and keeps the zone itself.
LOADERS: dict[str, dict[str, Callable[[Any], Any]]] = {
    POSTGRES: {"json": lambda v: v, "time": _utc, "bool": lambda v: v},
    SQLITE: {"json": _json, "time": _utc, "bool": lambda v: None if v is None else bool(v)},
}


def kinds_of(table: Table, names: Sequence[str]) -> tuple[str | None, ...]:
    """The kind of each named column (json, time, bool, or None for values both drivers return as they are)."""
    out: list[str | None] = []
    for name in names:
        kind = table.c[name].type
        out.append("json" if isinstance(kind, JSON) else "time" if isinstance(kind, DateTime)
                   else "bool" if isinstance(kind, Boolean) else None)
    return tuple(out)


@dataclass(frozen=True)
class Sql:
    """One statement: its text, which parameters are JSON or timestamps, and what kind each result column is."""

    text: str
    json: frozenset[str] = frozenset()
    times: frozenset[str] = frozenset()
    result: tuple[str | None, ...] = ()  # kinds of the result columns (``kinds_of``); shorter: the rest as they are
    rows: bool | None = None  # whether it returns rows (``returns_rows`` guesses when this is None)
    _rendered: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def returns_rows(self) -> bool:
        """Whether it returns rows: only then are they fetched, without building the result's column descriptions
        first (psycopg makes an object per column, 27 for a run's row). ``rows`` says so; else a SELECT does, and
        a write with RETURNING."""
        if self.rows is not None:
            return self.rows
        head = self.text.lstrip().upper()
        return head.startswith("SELECT") or (not head.startswith("WITH") and " RETURNING " in head)

    def rendered(self, dialect: str) -> str:
        text = self._rendered.get(dialect)
        if text is None:
            text = self.text.replace("{for_update}", " FOR UPDATE" if dialect == POSTGRES else "")
            if dialect == POSTGRES:
                text = _PARAM.sub(r"%(\1)s", text.replace("%", "%%"))
            self._rendered[dialect] = text
        return text

    @cached_property
    def _loads(self) -> dict[str, list[tuple[int, Callable[[Any], Any]]]]:
        return {dialect: [(i, loaders[k]) for i, k in enumerate(self.result) if k is not None]
                for dialect, loaders in LOADERS.items()}

    def params(self, values: Mapping[str, Any], dialect: str) -> dict[str, Any]:
        if not self.json and not (self.times and dialect == SQLITE):
            return dict(values)
        out = dict(values)
        for name in self.json:
            value = out.get(name)
            if value is not None:
                out[name] = json.dumps(value, default=str)
        if dialect == SQLITE:
            for name in self.times:
                value = out.get(name)
                if isinstance(value, datetime):
                    out[name] = _sqlite_time(value)
        return out

    def load(self, row: Sequence[Any], dialect: str) -> tuple[Any, ...]:
        loads = self._loads.get(dialect, [])
        if not loads:
            return tuple(row)
        values = list(row)
        for i, load in loads:
            values[i] = load(values[i])
        return tuple(values)


@dataclass(frozen=True)
class Rows:
    rows: list[tuple[Any, ...]]
    rowcount: int

    def first(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None


class Later:
    """The rows of a deferred statement whose answer is wanted (``defer(..., keep=True)``), once the round trip it went
    with is back: asking before that sends what is queued now (``flush``). A statement its transaction's rollback
    dropped unsent never ran: ``dropped``, and asking raises."""

    def __init__(self, conn: Connection, stmt: Sql) -> None:
        self._conn, self._stmt = conn, stmt
        self._rows: Rows | None = None
        self.dropped = False

    @property
    def sent(self) -> bool:
        return self._rows is not None

    def rows(self) -> Rows:
        if self._rows is None and not self.dropped:
            flush(self._conn)
        if self._rows is None:
            raise RuntimeError("a deferred statement that was dropped unsent has no rows")
        return self._rows

    def _got(self, raw: Sequence[Sequence[Any]], rowcount: int) -> None:
        dialect = self._conn.dialect.name
        self._rows = Rows([self._stmt.load(r, dialect) for r in raw], rowcount)


# A deferred statement: its text, its parameters (None: a script), and where its answer goes when it is wanted.
_Queued = tuple[str, dict[str, Any] | None, Later | None]


def execute(conn: Connection, stmt: Sql, values: Mapping[str, Any] | None = None) -> Rows:
    """Run ``stmt`` on ``conn``'s DBAPI connection (in the transaction it is in), returning its rows; what was
    deferred on the connection goes first, in the same round trip."""
    dialect = conn.dialect.name
    text = stmt.rendered(dialect)
    params = stmt.params(values or {}, dialect)
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an invalidated connection"
    if dialect != POSTGRES:
        cursor = dbapi.cursor()
        try:
            cursor.execute(text, params)
            raw = cursor.fetchall() if cursor.description else []
            rowcount = cursor.rowcount
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(conn, exc, text, cursor) from exc
        finally:
            cursor.close()
        return Rows([stmt.load(r, dialect) for r in raw], rowcount)
    queued = _queued.pop(dbapi, None)
    if queued:
        raw, rowcount = _pipelined(conn, dbapi, [*queued, (text, params, None)], stmt.returns_rows)
        return Rows([stmt.load(r, dialect) for r in raw], rowcount)
    raw, rowcount = _alone(conn, dbapi, text, params, stmt.returns_rows)
    return Rows([stmt.load(r, dialect) for r in raw], rowcount)


_cursors: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _forget_connections() -> None:
    """A forked child keeps nothing of its parent's connections' cursors or queues."""
    _cursors.clear()
    _queued.clear()


def _kept_cursors(dbapi: Any) -> list[Any]:
    """The connection's cursors, made once and used again (a cursor made per statement cost its setup each time,
    a fifth of the CPU of a transaction's round trip here): the first for a statement whose answer is not read, any
    number of them one after another; the rest, one each, for those of a round trip whose answer is."""
    kept = _cursors.get(dbapi)
    if kept is None or kept[0].closed:
        kept = _cursors[dbapi] = [dbapi.cursor()]
    return kept


def _cursor_of(dbapi: Any) -> Any:
    """The cursor for a statement in a round trip of its own."""
    return _kept_cursors(dbapi)[0]


def _forget_cursors(dbapi: Any) -> None:
    """After a failed round trip: the next makes the connection's cursors again, in a known state."""
    for cursor in _cursors.pop(dbapi, ()):
        cursor.close()


def _alone(conn: Connection, dbapi: Any, text: str, params: dict[str, Any] | None, rows: bool
           ) -> tuple[list[tuple[Any, ...]], int]:
    """One statement in its own round trip, on the connection's kept cursor (Postgres): its rows (when ``rows``) and
    row count. Prepared when it has parameters (``_send`` says why a script is not)."""
    cursor = _cursor_of(dbapi)
    try:
        cursor.execute(text, params, prepare=params is not None)
        return (cursor.fetchall() if rows else []), cursor.rowcount
    except conn.dialect.loaded_dbapi.Error as exc:
        wrapped = _wrapped(conn, exc, text, cursor)
        _forget_cursors(dbapi)
        raise wrapped from exc


def execute_script(conn: Connection, text: str) -> None:
    """A statement with no parameters and no result (BEGIN, COMMIT, SET LOCAL …), on the DBAPI connection; a
    COMMIT takes what is deferred with it, a ROLLBACK discards it."""
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an invalidated connection"
    if text == "ROLLBACK":
        _dropped(_queued.pop(dbapi, None))
    if conn.dialect.name != POSTGRES:
        cursor = dbapi.cursor()
        try:
            cursor.execute(text)
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(conn, exc, text, cursor) from exc
        finally:
            cursor.close()
        return
    queued = _queued.pop(dbapi, None)
    if queued:
        _pipelined(conn, dbapi, [*queued, (text, None, None)], False)
        return
    _alone(conn, dbapi, text, None, False)


# -- deferred statements (Postgres) -------------------------------------------------------------------------------

_queued: weakref.WeakKeyDictionary[Any, list[_Queued]] = weakref.WeakKeyDictionary()


@overload
def defer(conn: Connection, stmt: Sql, values: Mapping[str, Any] | None = None, *,
          keep: Literal[False] = False) -> None: ...
@overload
def defer(conn: Connection, stmt: Sql, values: Mapping[str, Any] | None = None, *, keep: Literal[True]) -> Later: ...
def defer(conn: Connection, stmt: Sql, values: Mapping[str, Any] | None = None, *, keep: bool = False
          ) -> Later | None:
    """Send ``stmt`` with the next statement executed on ``conn`` (or its COMMIT); SQLite: now (no round trip to
    save). An error of its is raised by the statement it goes with. ``keep``: its rows are wanted, from the
    ``Later`` returned, once that round trip is back (two questions in one round trip)."""
    dialect = conn.dialect.name
    later = Later(conn, stmt) if keep else None
    if dialect != POSTGRES:
        rows = execute(conn, stmt, values)
        if later is not None:
            later._rows = rows
        return later
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an invalidated connection"
    _queued.setdefault(dbapi, []).append((stmt.rendered(dialect), stmt.params(values or {}, dialect), later))
    return later


def defer_script(conn: Connection, text: str) -> None:
    """``execute_script``, deferred (one statement: BEGIN, SET LOCAL …)."""
    if conn.dialect.name != POSTGRES:
        execute_script(conn, text)
        return
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an invalidated connection"
    _queued.setdefault(dbapi, []).append((text, None, None))


def _dropped(queued: list[_Queued] | None) -> list[str]:
    for _, _, later in queued or ():
        if later is not None:
            later.dropped = True
    return [text for text, _, _ in queued or ()]


def undefer(conn: Connection, later: Later) -> bool:
    """Take ``later``'s statement back, unsent, from what is deferred on ``conn``: False when it is not there (it
    went already, or was dropped)."""
    dbapi = conn.connection.dbapi_connection if not conn.invalidated else None
    queued = _queued.get(dbapi) if dbapi is not None else None
    for i, (_, _, kept) in enumerate(queued or ()):
        if kept is later:
            del queued[i]  # type: ignore[index]
            if not queued:
                _queued.pop(dbapi, None)
            return True
    return False


def discard(conn: Connection) -> list[str]:
    """Drop what is deferred on ``conn`` (its transaction is being rolled back); the statements dropped."""
    dbapi = conn.connection.dbapi_connection if not conn.invalidated else None
    return _dropped(_queued.pop(dbapi, None)) if dbapi is not None else []


def flush(conn: Connection) -> None:
    """Send what is deferred on ``conn`` now: one statement on its own (a pipeline of one cost 142 µs of CPU here
    against 70 for the statement alone), more in one pipeline."""
    dbapi = conn.connection.dbapi_connection if not conn.invalidated else None
    queued = _queued.pop(dbapi, None) if dbapi is not None else None
    if not queued:
        return
    if len(queued) > 1:
        _pipelined(conn, dbapi, queued, False)
        return
    text, params, later = queued[0]
    try:
        raw, rowcount = _alone(conn, dbapi, text, params, later is not None and later._stmt.returns_rows)
    except BaseException:
        _dropped(queued)
        raise
    if later is not None:
        later._got(raw, rowcount)


def _pipelined(conn: Connection, dbapi: Any, statements: list[_Queued], rows: bool
               ) -> tuple[list[tuple[Any, ...]], int]:
    """Every statement in one round trip (psycopg's pipeline mode); the last one's rows and row count, and the rows
    of those whose answer is wanted (``Later``). The first error is raised (and the rest were not run: the
    transaction they were in is aborted; a ``Later`` among them is dropped)."""
    sent: list[Any] = []  # the cursor each statement went on
    error = conn.dialect.loaded_dbapi.Error
    try:
        _send(dbapi, statements, sent, error)
        for (_, _, later), cursor in zip(statements, sent, strict=True):
            if later is not None:
                later._got(cursor.fetchall() if later._stmt.returns_rows else [], cursor.rowcount)
        last = sent[-1]
        return (last.fetchall() if rows else []), last.rowcount
    except error as exc:
        _dropped(statements)
        text = statements[max(len(sent) - 1, 0)][0]  # the one being sent when the error came back
        wrapped = _wrapped(conn, exc, text, sent[-1] if sent else None)
        _forget_cursors(dbapi)
        raise wrapped from exc


def _send(dbapi: Any, statements: list[_Queued], sent: list[Any], error: type[Exception]) -> None:
    """Each statement in one pipeline, on the connection's kept cursors (the cursor of each in ``sent``): those whose
    answer is not read all on the first (a cursor's result is its last statement's), the others and the last on one
    each.

    A statement without parameters (BEGIN, COMMIT, SET LOCAL) is never prepared: it has nothing to plan, and psycopg
    would prepare it on its fifth run, naming it prepared as it sends the Parse -- behind a statement that fails, the
    server skips that Parse and psycopg keeps the name. The first error is raised once the pipeline has ended, not
    through its end: psycopg then logs a WARNING of its own ("error ignored terminating …") for every failed batch,
    every duplicate delivery's among them."""
    kept = _kept_cursors(dbapi)
    last, own = len(statements) - 1, 1
    failed: Exception | None = None
    try:
        with dbapi.pipeline():
            for i, (text, params, later) in enumerate(statements):
                if later is None and i != last:
                    cursor = kept[0]
                else:
                    if own == len(kept):
                        kept.append(dbapi.cursor())
                    cursor, own = kept[own], own + 1
                sent.append(cursor)
                try:
                    cursor.execute(text, params, prepare=params is not None)
                except error as exc:
                    failed = exc
                    break
    except error:
        if failed is None:  # the batch's error came at the pipeline's end (its sync)
            raise
    if failed is not None:  # the pipeline's end said only that ``failed`` aborted it
        raise failed


os.register_at_fork(after_in_child=_forget_connections)


def watch(engine: Engine) -> None:
    """Keep SQLAlchemy's own statements, commits and rollbacks in order with what is deferred: its statement or
    commit sends the queue first, its rollback discards it, and a connection is checked in with nothing queued."""
    if engine.dialect.name != POSTGRES or event.contains(engine, "before_cursor_execute", _before_core):
        return
    event.listen(engine, "before_cursor_execute", _before_core)
    event.listen(engine, "commit", flush)
    event.listen(engine, "rollback", discard)
    event.listen(engine, "checkin", _checked_in)  # on the engine: kept when its pool is replaced (dispose)


def _before_core(conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any,
                 executemany: bool) -> None:
    flush(conn)


def _checked_in(dbapi: Any, record: Any) -> None:
    if dbapi is not None and (left := _dropped(_queued.pop(dbapi, None))):
        log.error("a connection went back to the pool with statements still deferred; dropped",
                  extra={"statements": [text[:80] for text in left]})


def _wrapped(conn: Connection, exc: Exception, text: str, cursor: Any) -> BaseException:
    """The driver's error as SQLAlchemy raises it: a disconnect invalidates the connection (it is not handed back
    to the pool), and says so, which is what retries decide on (``roles/retry.py``). So does a prepared statement
    the server lacks: it sent the Parse in a round trip behind a statement that failed, which the server skipped (or
    a DEALLOCATE ALL passed it), and psycopg keeps the name; every later use of it on this connection would fail
    the same way, so this connection alone is closed and the step retried on another."""
    dialect = conn.dialect
    disconnect = False
    try:
        disconnect = dialect.is_disconnect(exc, conn.connection.dbapi_connection, cursor)
    except Exception:  # deciding must not hide the error itself
        disconnect = False
    invalidated = disconnect or getattr(exc, "sqlstate", None) == LOST_PREPARED
    if invalidated and not conn.invalidated:
        if disconnect:
            # As SQLAlchemy does with a disconnect it sees itself: every pooled connection as old as this one is
            # replaced at its next checkout (a restarted database dropped them all; without the pre-ping each would
            # otherwise fail one step first), and this one is closed, not handed back.
            mark_pool = getattr(conn.engine.pool, "_invalidate", None)
            if mark_pool is not None:
                mark_pool(conn.connection, exc, _checkin=False)
        conn.invalidate(exc)
    return DBAPIError.instance(text, None, exc, dialect.loaded_dbapi.Error, hide_parameters=True,
                               connection_invalidated=invalidated, dialect=dialect)
