"""The statements every iteration runs: written once, rendered once per dialect, sent by the driver's lowest layer.

SQLAlchemy Core builds, caches and post-processes each execution: measured here, an ``INSERT … ON CONFLICT DO
NOTHING RETURNING`` built per call costs 217 µs of CPU, prebuilt 105 µs, and the same text on psycopg's cursor
(prepared on the server after its first run) 55 µs; an iteration runs a few dozen of them. The statements here
are the hot path's; everything else stays SQLAlchemy Core. Both run on the same connection, so they mix in one
transaction: a statement here goes to the DBAPI connection under the SQLAlchemy ``Connection`` it is given,
inside whatever transaction that connection is in.

One text serves Postgres and SQLite: ``:name`` parameters (Postgres gets ``$1``…), ``{for_update}`` where Postgres
locks the rows read (SQLite has one writer anyway). Values are converted as SQLAlchemy's column types would: JSON
as text (Postgres casts it; SQLite keeps it), timestamps in the text form SQLAlchemy's SQLite ``DateTime`` reads
back, so rows written here read the same through Core and the other way round.

A driver error is raised as SQLAlchemy's wrapped error (``DBAPIError`` and its subclasses), with the connection
invalidated when it was a disconnect, so retries decide on one kind of error whichever path raised it.

Round trips. On Postgres every statement goes through libpq's pipeline mode (``_round_trip``: psycopg's ``pq``
layer, its adapters and its wait, no cursor), prepared once per connection. A statement whose result nobody reads
(a write checked by its constraints, BEGIN, ``SET LOCAL``) can be deferred: it is queued on the connection and sent
with the next statement that is executed or with the COMMIT, in one round trip (seven statements of a transaction
one by one cost 338 µs of CPU and 721 µs of wall time here through psycopg's cursors, pipelined 157 and 198; through
libpq 110–141 µs of CPU). Nothing queued is ever lost or reordered: SQLAlchemy's own statements and commits send the
queue first (``watch``), a rollback discards it, and a connection goes back to the pool with nothing queued. A
deferred statement's error is raised by the statement it went with.
"""

from __future__ import annotations

import json
import logging
import os
import re
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal, overload

from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.waiting import Ready, Wait
from sqlalchemy import JSON, Boolean, Connection, DateTime, Engine, Table, event
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

_PARAM = re.compile(r"(?<![:\w]):(\w+)")
# A table named after FROM, JOIN, UPDATE or INTO: its name, unquoted, without its schema.
_TABLE = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+(?:"?\w+"?\.)?"?(\w+)', re.IGNORECASE)
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


class Json(str):
    """JSON text encoded already (an outbox written by pydantic's serializer in one pass): a JSON parameter takes it
    as it is, where any other value is encoded with the json module."""

    __slots__ = ()


def _encoded(value: Any) -> str:
    return value if isinstance(value, Json) else json.dumps(value, default=str)


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
        """The text sent: SQLite's keeps ``:name``; Postgres's numbers them (``$1``; a name used twice is one
        number), in the order ``order`` gives."""
        text = self._rendered.get(dialect)
        if text is None:
            text = self.text.replace("{for_update}", " FOR UPDATE" if dialect == POSTGRES else "")
            if dialect == POSTGRES:
                numbers: dict[str, int] = {}
                text = _PARAM.sub(lambda m: f"${numbers.setdefault(m[1], len(numbers) + 1)}", text)
            self._rendered[dialect] = text
        return text

    @cached_property
    def tables(self) -> frozenset[str]:
        """The tables its text names (after FROM, JOIN, UPDATE, INTO): what it may read or write."""
        return frozenset(m.lower() for m in _TABLE.findall(self.text))

    @cached_property
    def order(self) -> tuple[str, ...]:
        """The parameters' names in the order of their numbers in the Postgres text."""
        return tuple(dict.fromkeys(m[1] for m in _PARAM.finditer(self.text)))

    @cached_property
    def prepared_as(self) -> bytes:
        """The name it is prepared under on a Postgres connection, once per connection; one name a text, so a
        statement built again per call is not prepared again (psycopg's own names are ``_pg3_…``)."""
        text = self.rendered(POSTGRES)
        name = _names.get(text)
        if name is None:
            name = _names.setdefault(text, f"agentfleet_{len(_names)}".encode())
        return name

    @cached_property
    def _loads(self) -> dict[str, list[tuple[int, Callable[[Any], Any]]]]:
        return {dialect: [(i, loaders[k]) for i, k in enumerate(self.result) if k is not None]
                for dialect, loaders in LOADERS.items()}

    def params(self, values: Mapping[str, Any], dialect: str) -> dict[str, Any]:
        """The values as the driver takes them: JSON as text, and SQLite's timestamps as SQLAlchemy stores them."""
        if not self.json and not (self.times and dialect == SQLITE):
            return dict(values)
        out = dict(values)
        for name in self.json:
            value = out.get(name)
            if value is not None:
                out[name] = _encoded(value)
        if dialect == SQLITE:
            for name in self.times:
                value = out.get(name)
                if isinstance(value, datetime):
                    out[name] = _sqlite_time(value)
        return out

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        """The values for Postgres's numbered parameters, in order (JSON as text)."""
        if not self.json:
            return [values[name] for name in self.order]
        out = [values[name] for name in self.order]
        for i in self._json_at:
            if out[i] is not None:
                out[i] = _encoded(out[i])
        return out

    @cached_property
    def _json_at(self) -> tuple[int, ...]:
        return tuple(i for i, name in enumerate(self.order) if name in self.json)

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
    dropped unsent, or one behind a failed statement, never ran: ``dropped``, and asking raises. One that ran before
    a failed statement keeps its answer, though its transaction did not commit."""

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


# A deferred statement: its text, the statement (None: a script, sent unprepared), its values in order, and where
# its answer goes when it is wanted.
_Queued = tuple[str, Sql | None, list[Any] | None, Later | None]


def execute(conn: Connection, stmt: Sql, values: Mapping[str, Any] | None = None) -> Rows:
    """Run ``stmt`` on ``conn``'s DBAPI connection (in the transaction it is in), returning its rows; what was
    deferred on the connection goes first, in the same round trip."""
    dialect = conn.dialect.name
    text = stmt.rendered(dialect)
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an invalidated connection"
    if dialect != POSTGRES:
        params = stmt.params(values or {}, dialect)
        cursor = dbapi.cursor()
        try:
            cursor.execute(text, params)
            raw = cursor.fetchall() if cursor.description else []
            rowcount = cursor.rowcount
        except conn.dialect.loaded_dbapi.Error as exc:
            raise sqlalchemy_error(conn, exc, text, cursor) from exc
        finally:
            cursor.close()
        return Rows([stmt.load(r, dialect) for r in raw], rowcount)
    this: _Queued = (text, stmt, stmt.args(values or {}), None)
    queued = _queued.pop(dbapi, None)
    raw, rowcount = _round_trip(conn, dbapi, [*queued, this] if queued else [this], stmt.returns_rows)
    return Rows([stmt.load(r, dialect) for r in raw], rowcount)


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
            raise sqlalchemy_error(conn, exc, text, cursor) from exc
        finally:
            cursor.close()
        return
    this: _Queued = (text, None, None, None)
    queued = _queued.pop(dbapi, None)
    _round_trip(conn, dbapi, [*queued, this] if queued else [this], False)


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
    _queued.setdefault(dbapi, []).append((stmt.rendered(dialect), stmt, stmt.args(values or {}), later))
    return later


def defer_script(conn: Connection, text: str) -> None:
    """``execute_script``, deferred (one statement: BEGIN, SET LOCAL …)."""
    if conn.dialect.name != POSTGRES:
        execute_script(conn, text)
        return
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an invalidated connection"
    _queued.setdefault(dbapi, []).append((text, None, None, None))


def _dropped(queued: list[_Queued] | None) -> list[str]:
    for _, _, _, later in queued or ():
        if later is not None and not later.sent:  # one answered before a failure keeps its answer
            later.dropped = True
    return [text for text, _, _, _ in queued or ()]


def undefer(conn: Connection, later: Later, *, unless_after: str | None = None) -> bool:
    """Take ``later``'s statement back, unsent, from what is deferred on ``conn``: False when it is not there (it
    went already, or was dropped), or when a statement deferred after it names the table ``unless_after`` (it might
    read what ``later``'s wrote)."""
    dbapi = conn.connection.dbapi_connection if not conn.invalidated else None
    queued = _queued.get(dbapi) if dbapi is not None else None
    for i, (_, _, _, kept) in enumerate(queued or ()):
        if kept is later:
            assert queued is not None
            if unless_after is not None and any(
                    stmt is not None and unless_after in stmt.tables for _, stmt, _, _ in queued[i + 1:]):
                return False
            del queued[i]
            if not queued:
                _queued.pop(dbapi, None)
            return True
    return False


def discard(conn: Connection) -> list[str]:
    """Drop what is deferred on ``conn`` (its transaction is being rolled back); the statements dropped."""
    dbapi = conn.connection.dbapi_connection if not conn.invalidated else None
    return _dropped(_queued.pop(dbapi, None)) if dbapi is not None else []


def flush(conn: Connection) -> None:
    """Send what is deferred on ``conn`` now, in one round trip."""
    dbapi = conn.connection.dbapi_connection if not conn.invalidated else None
    queued = _queued.pop(dbapi, None) if dbapi is not None else None
    if queued:
        _round_trip(conn, dbapi, queued, False)


# -- one round trip (Postgres) -------------------------------------------------------------------------------------

_names: dict[str, bytes] = {}  # by the text sent
_OK, _TUPLES = pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK
_FAILED, _SYNC = pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_SYNC
_IDLE = pq.TransactionStatus.IDLE


class _Session:
    """What is kept of one psycopg connection: the statements prepared on it (by ``Sql.prepared_as``), and the
    ``Transformer`` that turns values into parameters and result rows back into values, as psycopg's cursors do
    (the same adapters: a row reads the same whichever way it came)."""

    __slots__ = ("encoding", "prepared", "transformer")

    def __init__(self, dbapi: Any) -> None:
        _psycopg_prepares_nothing(dbapi, None)  # a connection made before ``watch`` (the rest: ``sqlalchemy_error``)
        self.prepared: set[bytes] = set()
        self.transformer = Transformer(dbapi)
        self.encoding: str = dbapi.info.encoding


_sessions: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()


def _forget_connections() -> None:
    """A forked child keeps nothing of its parent's connections' sessions or queues."""
    _sessions.clear()
    _queued.clear()


def _round_trip(conn: Connection, dbapi: Any, statements: list[_Queued], rows: bool
                ) -> tuple[list[tuple[Any, ...]], int]:
    """Every statement in one round trip, in libpq's pipeline mode; the last one's rows (when ``rows``) and row
    count, and the rows of those whose answer is wanted (``Later``). The first error is raised, as SQLAlchemy's
    (``sqlalchemy_error``); the statements behind it were not run (the transaction they were in is aborted), and a
    ``Later`` among them is dropped; one before it has its answer (a session's advisory lock taken there is held
    through the rollback, and its holder must know to let go of it).

    libpq directly, not psycopg's cursors and pipeline: measured on a handling-like transaction of seven statements,
    110–141 µs of client CPU against 237–277 (``benchmarks/round_trip_client.py``). What a psycopg cursor did is
    done here: a statement with parameters is prepared once per connection (its Parse goes in the round trip of its
    first use; only a Parse the server answered counts), parameters and rows go through psycopg's adapters, a
    connection outside autocommit gets its BEGIN first, and the wait lets the GIL go. A statement without parameters
    (BEGIN, COMMIT, SET LOCAL) is not prepared: it has nothing to plan. A round trip stopped between its sending and
    its last answer (the connection lost, an exception thrown into the wait) leaves the connection in a state
    nobody knows: it is not used again."""
    session = _sessions.get(dbapi)
    if session is None:
        session = _sessions[dbapi] = _Session(dbapi)
    pg, tx, failed_at = dbapi.pgconn, session.transformer, len(statements) - 1
    try:
        if not dbapi.autocommit and pg.transaction_status == _IDLE:  # the BEGIN psycopg's cursor would send
            statements = [(dbapi._get_tx_start_command().decode(), None, None, None), *statements]
        params = [tx.dump_sequence(args, [PyFormat.TEXT] * len(args)) if args else None
                  for _, _, args, _ in statements]
        with dbapi.lock:
            results, commands = _exchange(dbapi, pg, session, statements, params)
        answers, failed_at, failure = _sorted(session, results, commands, len(statements))
        if failure is not None:
            for (_, _, _, later), result in zip(statements[:failed_at], answers, strict=False):
                if later is not None:  # its answer stands: a session's advisory lock taken there outlives the rollback
                    later._got(*_answer(tx, later._stmt.returns_rows, result))
            raise errors.error_from_result(failure, encoding=session.encoding)
    except conn.dialect.loaded_dbapi.Error as exc:
        _dropped(statements)
        lost = pg.pipeline_status != pq.PipelineStatus.OFF
        raise sqlalchemy_error(conn, exc, statements[min(failed_at, len(statements) - 1)][0], None, lost=lost) from exc
    except BaseException:
        _dropped(statements)
        if pg.pipeline_status != pq.PipelineStatus.OFF and not conn.invalidated:
            conn.invalidate()
        raise
    last, out = len(statements) - 1, ([], -1)
    for i, ((_, _, _, later), result) in enumerate(zip(statements, answers, strict=True)):
        if later is None and i != last:
            continue
        answer = _answer(tx, later._stmt.returns_rows if later is not None else rows, result)
        if later is not None:
            later._got(*answer)
        if i == last:
            out = answer
    return out


def _answer(tx: Any, rows: bool, result: Any) -> tuple[list[tuple[Any, ...]], int]:
    """One statement's rows (when wanted) and row count, from its result."""
    got: list[tuple[Any, ...]] = []
    if rows and result.ntuples:
        tx.set_pgresult(result)
        got = tx.load_rows(0, result.ntuples, tuple)
    count = result.command_tuples
    return got, -1 if count is None else count


# What each command of a round trip was: the statement's index, and the name a Parse prepares (None: its execution).
_Command = tuple[int, bytes | None]


def _exchange(dbapi: Any, pg: Any, session: _Session, statements: list[_Queued], params: list[Any]
              ) -> tuple[list[Any], list[_Command]]:
    """Send each statement (after its Parse, on its first use on this connection) and a sync, in pipeline mode; read
    every result up to the sync's. One result a command, in order."""
    commands: list[_Command] = []
    parsed: set[bytes] = set()  # a statement used twice in the round trip is parsed once
    pg.enter_pipeline_mode()
    for i, ((text, stmt, _, _), values) in enumerate(zip(statements, params, strict=True)):
        if stmt is None:
            pg.send_query_params(text.encode(), None)
        else:
            name = stmt.prepared_as
            if name not in session.prepared and name not in parsed:
                pg.send_prepare(name, text.encode())
                parsed.add(name)
                commands.append((i, name))
            pg.send_query_prepared(name, values)
        commands.append((i, None))
    pg.pipeline_sync()
    results = dbapi.wait(_sent_and_read(pg))
    pg.exit_pipeline_mode()
    return results, commands


def _sent_and_read(pg: Any) -> Generator[Wait, Ready, list[Any]]:
    """psycopg's waiting generator for one pipelined round trip: flush what is queued (reading meanwhile, so that a
    server blocked writing answers never waits on a client blocked writing), then read every result up to the
    sync's. ``Connection.wait`` drives it, letting the GIL go while the socket is not ready."""
    while pg.flush() != 0:
        while not (ready := (yield Wait.RW)):
            continue
        if ready & Ready.R:
            pg.consume_input()
    results: list[Any] = []
    while True:
        while pg.is_busy():
            while not (yield Wait.R):
                continue
            pg.consume_input()
        result = pg.get_result()
        if result is None:  # the end of one command's results
            continue
        results.append(result)
        if result.status == _SYNC:
            return results


def _sorted(session: _Session, results: list[Any], commands: list[_Command], n: int
            ) -> tuple[list[Any], int, Any]:
    """Each statement's result, the index of the first that failed (or of the last), and that failure's result (or
    None). A Parse the server answered counts as prepared on this connection from now on."""
    answers: list[Any] = [None] * n
    for (i, parse), result in zip(commands, results, strict=False):
        status = result.status
        if status == _FAILED:
            return answers, i, result
        if parse is not None:
            if status == _OK:
                session.prepared.add(parse)
        else:
            answers[i] = result
    return answers, n - 1, None


os.register_at_fork(after_in_child=_forget_connections)


def watch(engine: Engine) -> None:
    """Keep SQLAlchemy's own statements, commits and rollbacks in order with what is deferred: its statement or
    commit sends the queue first, its rollback discards it, and a connection is checked in with nothing queued; and
    psycopg prepares nothing of its own on the engine's connections (``_psycopg_prepares_nothing``)."""
    if engine.dialect.name != POSTGRES or event.contains(engine, "before_cursor_execute", _before_core):
        return
    event.listen(engine, "before_cursor_execute", _before_core)
    event.listen(engine, "commit", flush)
    event.listen(engine, "rollback", discard)
    event.listen(engine, "checkin", _checked_in)  # on the engine: kept when its pool is replaced (dispose)
    event.listen(engine, "connect", _psycopg_prepares_nothing)


def _psycopg_prepares_nothing(dbapi: Any, record: Any) -> None:
    """psycopg prepares a statement it has run five times, and at a ROLLBACK it sees with any of its own prepared it
    sends ``DEALLOCATE ALL``, which takes this module's statements with it (the next use fails, and costs a step and
    the connection). So psycopg prepares nothing on a connection this module uses: SQLAlchemy's statements are off
    the hot path, and each is planned per run, as psycopg does with any statement it has run fewer times."""
    dbapi.prepare_threshold = None


def _before_core(conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any,
                 executemany: bool) -> None:
    flush(conn)


def _checked_in(dbapi: Any, record: Any) -> None:
    if dbapi is not None and (left := _dropped(_queued.pop(dbapi, None))):
        log.error("a connection went back to the pool with statements still deferred; dropped",
                  extra={"statements": [text[:80] for text in left]})


def sqlalchemy_error(conn: Connection, exc: Exception, text: str, cursor: Any, *, lost: bool = False) -> BaseException:
    """The driver's error as SQLAlchemy raises it: a disconnect invalidates the connection (it is not handed back
    to the pool), and says so, which is what retries decide on (``roles/retry.py``). So does a connection ``lost``
    mid-round-trip, and one whose prepared statement the server lacks (a ``DEALLOCATE ALL`` passed it): every later
    use of it on this connection would fail the same way, so this connection alone is closed and the step retried
    on another."""
    dialect = conn.dialect
    disconnect = False
    try:
        disconnect = dialect.is_disconnect(exc, conn.connection.dbapi_connection, cursor)
    except Exception:  # deciding must not hide the error itself
        disconnect = False
    invalidated = disconnect or lost or getattr(exc, "sqlstate", None) == LOST_PREPARED
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
