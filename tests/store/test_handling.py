"""The store's hot-path plumbing: one connection per handling, statements on the driver's cursor, no pre-ping.

What it must keep: a row written by ``store.sql`` reads the same through SQLAlchemy Core (and the other way round)
on both databases; a handling's transactions, reads and step lock share one session, and nothing a handling holds
outlives it; a connection the database dropped costs one failed, retryable step, not one per pooled connection.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import DBAPIError

from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import Message
from agentfleet.roles.retry import is_transient
from agentfleet.store import Store, make_engine
from agentfleet.store import tables as T
from agentfleet.store.sql import Sql, defer, execute

pytestmark = pytest.mark.integration

BACKEND_PID = Sql("SELECT pg_backend_pid()")
# A real event (other tests of the session's database decode every stored outbox), with text JSON must keep.
OUTBOX = Envelope.new(EventType.RUN_CANCEL_REQUESTED, "r-sql", RunCancelRequested(reason="ü ∆ \\ \"q\" 1.5"),
                      trace_id="t").wire()
SYNC_COMMIT = Sql("SELECT current_setting('synchronous_commit')")


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    engine = make_engine(pg_url)
    yield Store(engine)
    engine.dispose()


def test_rows_written_on_the_driver_read_the_same_through_core_and_back(store: Store) -> None:
    at = datetime(2026, 12, 1, 20, 37, 30, 5, tzinfo=UTC)
    with store.tx() as conn:
        assert store.create_run(conn, run_id="r-sql", agent="a", goal_id="g", trace_id="t",
                                input={"nested": [1, "two", None]}, limits={"max_steps": 3})
        store.mark_processed(conn, "e-sql", "planner", [OUTBOX], run_id="r-sql")
        store.write_messages(conn, "r-sql", [(0, 0, Message(role="assistant", content="hi")),
                                             (0, 1, Message(role="tool", tool_call_id="c", content="ok"))])
        conn.execute(insert(T.steps).values(idempotency_key="k-core", run_id="r-sql", iteration=0, kind="tool",
                                            status="started", attempts=1, input={"a": [1]}, started_at=at))
    run = store.get_run("r-sql")  # written by Core, read on the driver
    assert run is not None and run.input == {"nested": [1, "two", None]} and run.limits == {"max_steps": 3}
    assert run.created_at.tzinfo is not None and run.unpriced is False and run.state == RunState.PENDING
    again = store.begin_step(key="k-core", run_id="r-sql", iteration=0, kind="tool")
    assert again.attempts == 2 and again.input == {"a": [1]} and not again.fresh
    with store.engine.connect() as conn:  # written on the driver, read by Core
        outbox = conn.execute(select(T.processed_events.c.outbox, T.processed_events.c.processed_at)
                              .where(T.processed_events.c.event_id == "e-sql")).one()
        bodies = conn.execute(select(T.messages.c.body).where(T.messages.c.run_id == "r-sql")
                              .order_by(T.messages.c.position)).scalars().all()
        started = conn.execute(select(T.steps.c.started_at).where(T.steps.c.idempotency_key == "k-core")).scalar()
    assert outbox.outbox == [OUTBOX]
    assert outbox.processed_at is not None
    assert [b["content"] for b in bodies] == ["hi", "ok"]
    assert started is not None and started.replace(tzinfo=None) > at.replace(tzinfo=None)
    assert [m.content for m in store.transcript("r-sql")] == ["hi", "ok"]


def test_a_handlings_transactions_reads_and_step_lock_share_one_session(pg_store: Store) -> None:
    store = pg_store
    with store.handling():
        with store.reading() as conn:
            first = execute(conn, BACKEND_PID).scalar()
        with store.step_lock("k-shared") as held:
            assert held
            with store.tx() as conn:
                assert execute(conn, BACKEND_PID).scalar() == first
                with store.reading() as other:  # a read beside an open transaction does not see into it
                    assert execute(other, BACKEND_PID).scalar() != first
            with store.step_lock("k-shared", own_connection=True) as elsewhere:
                assert not elsewhere  # held: by the handling's own session
    with store.step_lock("k-shared", own_connection=True) as after:
        assert after, "released with the handling"


def test_a_relaxed_transaction_does_not_wait_for_the_disk_and_the_next_one_does(pg_store: Store) -> None:
    store = pg_store
    with store.handling():
        with store.tx(durable=False) as conn:
            assert execute(conn, SYNC_COMMIT).scalar() == "off"
        with store.tx() as conn:
            assert execute(conn, SYNC_COMMIT).scalar() == "on"
            store.relax(conn)
            assert execute(conn, SYNC_COMMIT).scalar() == "off"
        with store.reading() as conn:
            assert execute(conn, SYNC_COMMIT).scalar() == "on"


def test_a_handling_left_by_an_exception_holding_a_lock_does_not_hand_it_to_the_pool(pg_store: Store) -> None:
    store = pg_store
    lock = store.step_lock("k-leak")
    with pytest.raises(RuntimeError), store.handling():
        assert lock.__enter__()
        raise RuntimeError("the handler crashed before its lock was released")
    with store.step_lock("k-leak", own_connection=True) as held:
        assert held, "the connection that held it was closed, and its session's lock with it"


def test_a_handlings_connection_goes_back_to_the_pool_as_it_was_lent_out_of_autocommit(pg_url: str) -> None:
    """The handling puts its connection in autocommit on the driver, behind SQLAlchemy's back (its isolation
    option cost ~35 µs a handling): it must undo that itself, whichever way the handling ends, or the next borrower's
    ``engine.begin()`` would commit each statement on its own."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)  # every borrower gets the one connection
    store = Store(engine)
    try:
        def lent_out_as_sqlalchemy_lends_it() -> None:
            with engine.connect() as conn:
                driver = conn.connection.driver_connection
                assert driver is not None and driver.autocommit is False
            name = f"r-lent-{uuid.uuid4().hex[:8]}"
            with pytest.raises(RuntimeError), engine.begin() as conn:
                assert store.create_run(conn, run_id=name, agent="a", goal_id=name, trace_id="t", input={},
                                        limits={})
                raise RuntimeError("rolled back: the row must not stay")
            assert store.get_run(name) is None

        with store.handling(), store.reading() as conn:  # a read: one statement, no transaction around it
            assert conn.connection.driver_connection.autocommit is True
            execute(conn, BACKEND_PID)
        lent_out_as_sqlalchemy_lends_it()
        with store.handling(), pytest.raises(DBAPIError), store.tx() as conn:
            execute(conn, Sql("SELECT 1 / 0"))
        lent_out_as_sqlalchemy_lends_it()
        with pytest.raises(RuntimeError), store.handling():
            with store.tx() as conn:
                execute(conn, BACKEND_PID)
            raise RuntimeError("the handler failed after its commit")
        lent_out_as_sqlalchemy_lends_it()
    finally:
        engine.dispose()


def test_a_pooled_connection_found_closed_at_a_handlings_start_fails_it_retryably_and_is_not_kept_out(
        pg_url: str) -> None:
    """Closed under the pool (the database dropped it and psycopg noticed): setting autocommit on it fails. The
    handling fails with a transient error (the step is retried), and the connection goes back invalidated: a pool of
    one must lend a fresh one next, not wait for one that never comes back."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, pool_timeout=2)
    store = Store(engine)
    try:
        with engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
        driver.close()  # behind SQLAlchemy's back, as a dropped connection psycopg has seen
        with pytest.raises(Exception) as failed, store.handling():
            pass
        assert is_transient(failed.value), repr(failed.value)
        with store.handling(), store.reading() as conn:
            assert execute(conn, BACKEND_PID).scalar()
    finally:
        engine.dispose()


def test_a_failed_transaction_leaves_the_handlings_connection_usable(store: Store) -> None:
    with store.tx() as conn:
        assert store.create_run(conn, run_id="r-fail", agent="a", goal_id="g-fail", trace_id="t", input={}, limits={})
    with store.handling():
        with pytest.raises(Exception), store.tx() as conn:  # noqa: B017 - the driver's own integrity error
            conn.execute(insert(T.runs).values(run_id="r-fail", agent="a", goal_id="g-fail", trace_id="t",
                                               state="PENDING", version=0, iteration=0, input={}, limits={},
                                               steps_used=0, input_tokens=0, output_tokens=0, cost_usd=0.0,
                                               created_at=datetime.now(UTC), updated_at=datetime.now(UTC)))
        with store.tx() as conn:  # rolled back, not left in a failed transaction
            assert store.get_run("r-fail", conn) is not None


def test_a_connection_the_database_dropped_fails_one_step_then_the_pool_recovers(pg_store: Store) -> None:
    store = pg_store
    with store.handling(), store.reading() as conn:
        pids = {execute(conn, BACKEND_PID).scalar()}
    # Several connections in the pool, as a busy worker has them.
    held = [store.engine.connect() for _ in range(3)]
    for c in held:
        pids.add(c.execute(text("SELECT pg_backend_pid()")).scalar())
        c.close()
    with make_engine(str(store.engine.url.render_as_string(hide_password=False))).connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(pid) FROM unnest(CAST(:pids AS int[])) AS pid"),
                      {"pids": list(pids)})
        admin.commit()
    failures = []
    for _ in range(3):
        try:
            with store.handling(), store.tx() as conn:
                execute(conn, BACKEND_PID)
        except Exception as exc:
            failures.append(exc)
    assert len(failures) == 1, failures  # the first statement on a dead connection; then every old one is replaced
    assert is_transient(failures[0]), failures[0]


def test_handlings_on_threads_use_their_own_connections(pg_store: Store) -> None:
    store = pg_store
    seen: list[int] = []
    barrier = threading.Barrier(3)

    def handle() -> None:
        with store.handling():
            with store.reading() as conn:
                seen.append(execute(conn, BACKEND_PID).scalar())
            barrier.wait(timeout=10)  # all three hold theirs at once

    threads = [threading.Thread(target=handle) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(set(seen)) == 3


# -- deferred statements: sent with the next round trip, never lost, never reordered --------------------------------

NOTE = Sql("INSERT INTO fleet_secrets (name, value, created_at) VALUES (:name, :value, :at)", times=frozenset({"at"}))
NOTED = Sql("SELECT value FROM fleet_secrets WHERE name = :name")


def _note(conn: object, name: str, value: str = "v") -> None:
    defer(conn, NOTE, {"name": name, "value": value, "at": datetime.now(UTC)})  # type: ignore[arg-type]


def test_a_deferred_write_goes_before_the_next_statement_whichever_kind(store: Store) -> None:
    with store.handling(), store.tx() as conn:
        _note(conn, "d-next")
        assert execute(conn, NOTED, {"name": "d-next"}).scalar() == "v"  # ours: in the same round trip, first
        _note(conn, "d-core")
        got = conn.execute(select(T.fleet_secrets.c.value).where(T.fleet_secrets.c.name == "d-core")).scalar()
        assert got == "v"  # SQLAlchemy's own statement sends the queue first
        _note(conn, "d-commit")
    with store.reading() as conn:
        assert execute(conn, NOTED, {"name": "d-commit"}).scalar() == "v"  # the COMMIT took it


def test_a_rolled_back_transaction_leaves_nothing_deferred_behind(store: Store) -> None:
    for bound in (True, False):
        name = f"d-rolled-{bound}"
        with pytest.raises(RuntimeError):
            if bound:
                with store.handling(), store.tx() as conn:
                    _note(conn, name)
                    raise RuntimeError("the handler failed")
            else:
                with store.tx() as conn:
                    _note(conn, name)
                    raise RuntimeError("the handler failed")
        with store.tx() as conn:  # the next transaction on a pooled connection sends nothing left over
            execute(conn, NOTED, {"name": "none"})
        with store.reading() as conn:
            assert execute(conn, NOTED, {"name": name}).scalar() is None


def test_a_deferred_write_that_fails_fails_its_transaction(store: Store) -> None:
    with store.tx() as conn:
        _note(conn, "d-once")
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"), store.handling(), store.tx() as conn:
        _note(conn, "d-after-fail", "x")
        _note(conn, "d-once")  # the same primary key again
        execute(conn, NOTED, {"name": "d-once"})
    with store.reading() as conn:
        assert execute(conn, NOTED, {"name": "d-after-fail"}).scalar() is None, "rolled back with it"


def test_an_event_handled_twice_is_found_at_its_commit_and_changes_nothing(store: Store) -> None:
    from agentfleet.store.base import AlreadyHandled

    with store.handling(), store.tx() as conn:
        assert store.mark_processed(conn, "e-twice", "observer", [OUTBOX], deferred=True)
    with pytest.raises(AlreadyHandled), store.handling(), store.tx() as conn:
        _note(conn, "d-second-handling")
        if not store.mark_processed(conn, "e-twice", "observer", [], deferred=True):
            raise AlreadyHandled()  # SQLite knows at once
    assert store.processed_outbox("e-twice", "observer") == [OUTBOX]
    with store.reading() as conn:
        assert execute(conn, NOTED, {"name": "d-second-handling"}).scalar() is None


def test_a_step_lock_goes_with_the_handlings_last_commit_and_stays_if_that_commit_fails(pg_store: Store) -> None:
    store = pg_store
    with store.handling(), store.step_lock("k-commit") as held:
        assert held
        with store.tx() as conn:
            store.release_held(conn)
            with store.step_lock("k-commit", own_connection=True) as elsewhere:
                assert not elsewhere, "still held until the COMMIT"
        with store.step_lock("k-commit", own_connection=True) as elsewhere:
            assert elsewhere, "let go with the COMMIT, while the handling goes on"
    with store.handling(), store.step_lock("k-fail") as held:
        assert held
        with pytest.raises(RuntimeError), store.tx() as conn:
            store.release_held(conn)
            raise RuntimeError("the transaction fails before its COMMIT")
        with store.step_lock("k-fail", own_connection=True) as elsewhere:
            assert not elsewhere, "not committed: still held"
    with store.step_lock("k-fail", own_connection=True) as elsewhere:
        assert elsewhere, "let go by step_lock, as before"


HOSTILE = ["'); DROP TABLE fleet_secrets; --", "%s %(name)s %% $1 ?", "back\\slash \\' \\\\'", "new\nline\ttab",
           "ü ∆ 😀 \u200b", "E'\\x41'", "; COMMIT; BEGIN;", "", " " * 3, "x" * 120]


def test_values_batched_into_one_round_trip_are_bound_exactly_and_never_read_as_sql(store: Store) -> None:
    """A batch is one query string with its values bound by the client: every value comes back as it was sent,
    and none ends a statement or a transaction."""
    with store.handling(), store.tx() as conn:
        for i, value in enumerate(HOSTILE):
            _note(conn, f"d-hostile-{i}", value)
        assert execute(conn, NOTED, {"name": "d-hostile-0"}).scalar() == HOSTILE[0]  # the batch's last statement
        for i, value in enumerate(HOSTILE):
            _note(conn, f"d-hostile-again-{i}", value)
    with store.reading() as conn:
        for i, value in enumerate(HOSTILE):
            assert execute(conn, NOTED, {"name": f"d-hostile-{i}"}).scalar() == value
            assert execute(conn, NOTED, {"name": f"d-hostile-again-{i}"}).scalar() == value
    if store.dialect != "postgresql":  # SQLite keeps a NUL; Postgres text cannot
        return
    with pytest.raises(Exception, match=r"(?i)nul|0x00"), store.handling(), store.tx() as conn:
        _note(conn, "d-nul-before")
        _note(conn, "d-nul", "a\x00b")  # Postgres text cannot hold NUL: an error, and the batch with it
        execute(conn, NOTED, {"name": "d-nul"})
    with store.reading() as conn:
        assert execute(conn, NOTED, {"name": "d-nul-before"}).scalar() is None


def test_a_transition_and_its_audit_row_batched_keep_their_types(store: Store) -> None:
    """The audited transition's ``INSERT … SELECT`` takes its values from the client-bound string: timestamps,
    numbers, JSON and NULLs land in their columns' types."""
    audited, run_id = Store(store.engine, audit=True), f"r-batched-{uuid.uuid4().hex}"
    with audited.handling(), audited.tx() as conn:
        assert audited.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t",
                                  input={"q": "'; --"}, limits={})
    run = audited.get_run(run_id)
    assert run is not None
    with audited.handling(), audited.tx() as conn:
        assert audited.transition(conn, run, RunState.PLANNING, result={"text": "%s'\\"}, error_code=None)
    moved = audited.get_run(run_id)
    assert moved is not None and moved.state == RunState.PLANNING and moved.result == {"text": "%s'\\"}
    with store.engine.connect() as conn:
        rows = conn.execute(select(T.audit.c.from_state, T.audit.c.to_state, T.audit.c.at)
                            .where(T.audit.c.run_id == run_id)).all()
    assert [(r.from_state, r.to_state) for r in rows][-1] == ("PENDING", "PLANNING")
    assert all(r.at is not None for r in rows)


def test_a_statement_names_the_tables_it_reads_or_writes_however_it_spells_them() -> None:
    """What keeps two moves of a run apart (a statement between them that might read the row) is found from the
    statement's text: a table named with its schema, quoted, in a CTE or after a join counts as named."""
    for named in ("SELECT 1 FROM runs", "SELECT 1 FROM public.runs", 'select 1 from "runs"',
                  'DELETE FROM "public"."runs"',
                  "WITH x AS (UPDATE runs SET state = :s RETURNING 1) INSERT INTO audit SELECT 1 FROM x",
                  "SELECT 1 FROM steps s JOIN runs r ON r.run_id = s.run_id"):
        assert "runs" in Sql(named).tables, named
    assert "runs" not in Sql("INSERT INTO messages (run_id) VALUES (:run_id)").tables
    assert "runs" not in Sql("SELECT thread_runs FROM threads").tables


UPDATED_HERE = Sql("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runs'")


@pytest.mark.parametrize("between", ["messages", "runs"])
def test_two_moves_of_a_held_run_in_one_transaction_go_as_one_update_with_both_audit_rows(
        pg_store: Store, between: str) -> None:
    """A plan made first moves its run twice in its commit (OBSERVING → PLANNING, then → EXECUTING): the two go as one
    UPDATE (one row version and one set of index entries, not two), from where the first began to where the second
    ends, the version counting both, each move's audit row in order. A statement between them that names the runs
    table (it might read the row) keeps them apart."""
    audited, run_id = Store(pg_store.engine, audit=True), f"r-fused-{uuid.uuid4().hex}"
    with audited.handling(), audited.tx() as conn:
        assert audited.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
    run = audited.get_run(run_id)
    assert run is not None
    with audited.handling(), audited.tx() as conn:
        held = audited.hold_run(conn, run)
        assert held is not None
        planning = audited.transition(conn, held, RunState.PLANNING, iteration=1)
        assert planning is not None
        if between == "runs":  # deferred too: sent with the moves, after the first
            defer(conn, Sql("SELECT count(*) FROM runs WHERE run_id = :run_id"), {"run_id": run_id})
        else:
            audited.write_messages(conn, run_id, [(1, 0, Message(role="assistant", content="hi"))])
        executing = audited.transition(conn, planning, RunState.EXECUTING, steps_used=1, output_tokens=5)
        assert executing is not None and executing.version == run.version + 2
        updates = execute(conn, UPDATED_HERE).scalar()  # sends what is deferred, then counts this transaction's
    assert updates == (1 if between == "messages" else 2)
    after = audited.get_run(run_id)
    assert after is not None and (after.state, after.version, after.iteration) == (RunState.EXECUTING,
                                                                                   run.version + 2, 1)
    assert (after.steps_used, after.output_tokens) == (1, 5)
    trail = audited.audit_trail(run_id)
    assert [(r["from_state"], r["to_state"]) for r in trail] == [("PENDING", "PLANNING"), ("PLANNING", "EXECUTING")]
    assert trail[0]["iteration"] == 1 and trail[1]["output_tokens"] == 5


def test_a_connection_whose_prepared_statements_the_server_lost_fails_one_step_retryably_then_is_replaced(
        pg_store: Store) -> None:
    """The server no longer has a statement prepared on a connection (a ``DEALLOCATE ALL`` nobody here sent). Every
    later use of that statement on that pooled connection failed with "prepared statement … does not exist", a
    ProgrammingError: the step failed for good (seen in the duplicate delivery test: 12 steps dead-lettered, when
    psycopg's cursors prepared them). Now the connection is dropped and the step is retried, as after a
    disconnect."""
    store = pg_store
    with store.tx() as conn:
        _note(conn, "d-lost-prepared")
    with store.handling():
        with store.tx() as conn:
            execute(conn, NOTED, {"name": "d-lost-prepared"})  # prepared on this connection
            conn.connection.dbapi_connection.pgconn.exec_(b"DEALLOCATE ALL")  # behind psycopg's back
        with pytest.raises(Exception) as failed, store.tx() as conn:
            execute(conn, NOTED, {"name": "d-lost-prepared"})
        assert is_transient(failed.value), failed.value
    with store.handling(), store.tx() as conn:  # the next handling gets a connection that works
        assert execute(conn, NOTED, {"name": "d-lost-prepared"}).scalar() == "v"


def test_a_batch_that_fails_raises_its_error_and_logs_nothing_of_psycopgs(
        pg_store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """A batch whose write fails (every duplicate delivery's dedupe mark does, at its COMMIT) raised the error from
    inside psycopg's pipeline block, and psycopg logged a WARNING as it left it ("error ignored terminating
    <psycopg.Pipeline [INERROR]>: pipeline aborted"): one line of noise per duplicate, naming host, user and
    database. The error is the same; the log is quiet."""
    store = pg_store
    with store.tx() as conn:
        _note(conn, "d-quiet")
    with caplog.at_level("WARNING"), pytest.raises(Exception, match=r"(?i)unique|duplicate"), store.handling(), \
            store.tx() as conn:
        _note(conn, "d-quiet")
        execute(conn, NOTED, {"name": "d-quiet"})
    assert not [r for r in caplog.records if r.name.startswith("psycopg")], caplog.text


def _deferred(conn: object) -> list[str]:
    """The statements waiting on ``conn`` for its next round trip (Postgres), without sending them."""
    from agentfleet.store.sql import _queued

    dbapi = conn.connection.dbapi_connection  # type: ignore[attr-defined]
    return [text for text, _, _, _ in _queued.get(dbapi, [])]


def test_a_transition_of_a_run_its_transaction_holds_waits_for_the_next_round_trip(pg_store: Store) -> None:
    """Read FOR UPDATE (or created) in the transaction, the run cannot move under it: its compare-and-set goes with
    the next statement or the COMMIT instead of a round trip of its own. A run the transaction holds at another
    version, or does not hold, is still checked at once, and a stale move is refused."""
    store, run_id = Store(pg_store.engine, audit=True), f"r-held-{uuid.uuid4().hex}"
    with store.handling(), store.tx() as conn:
        created = store.start_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        planning = store.transition(conn, created, RunState.PLANNING)
        assert planning is not None and any(t.startswith("WITH moved AS (UPDATE runs") for t in _deferred(conn))
        executing = store.transition(conn, planning, RunState.EXECUTING, steps_used=1)
        deferred = _deferred(conn)  # the two moves as one, the first's audit row on its own (one UPDATE, not two)
        assert executing is not None and len([t for t in deferred if "UPDATE runs" in t]) == 1
        assert len([t for t in deferred if t.startswith("INSERT INTO audit")]) == 1
    with store.handling(), store.tx() as conn:
        held = store.get_run(run_id, conn, lock=True)
        assert held is not None and held.state == RunState.EXECUTING and held.version == 2 and held.steps_used == 1
        assert store.transition(conn, created, RunState.PLANNING) is None, "stale: refused, at once"
        assert not any("UPDATE runs" in t for t in _deferred(conn))
        assert store.transition(conn, held, RunState.OBSERVING) is not None
    with store.handling(), store.tx() as conn:
        unheld = store.get_run(run_id, conn)  # read, not held: checked at once
        assert unheld is not None and store.transition(conn, unheld, RunState.PLANNING) is not None
        assert not any("UPDATE runs" in t for t in _deferred(conn))
    assert [(a["from_state"], a["to_state"]) for a in store.audit_trail(run_id)] == [
        ("PENDING", "PLANNING"), ("PLANNING", "EXECUTING"), ("EXECUTING", "OBSERVING"), ("OBSERVING", "PLANNING")]


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each round trip to Postgres from here on, by the first words of its last statement."""
    from agentfleet.store import sql

    trips: list[str] = []
    round_trip = sql._round_trip

    def counted(conn: object, dbapi: object, statements: list, rows: bool) -> object:
        trips.append(statements[-1][0][:30] if len(statements) > 1 else "(alone)")
        return round_trip(conn, dbapi, statements, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(sql, "_round_trip", counted)
    return trips


def test_a_step_lock_asked_after_the_first_read_goes_with_it_and_one_held_elsewhere_is_not_taken(
        pg_store: Store, round_trips: list[str]) -> None:
    store, run_id = pg_store, f"r-lock-{uuid.uuid4().hex}"
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
    round_trips.clear()
    with store.handling(), store.step_lock("k-with-read") as held, store.tx() as conn:
        assert store.get_run(run_id, conn, lock=True) is not None
        assert len(round_trips) == 1, "the lock, BEGIN and the read: one round trip"
        assert held
        with store.step_lock("k-with-read", own_connection=True) as elsewhere:
            assert not elsewhere
    with store.step_lock("k-with-read", own_connection=True) as after:
        assert after, "let go at the end"
        with store.handling(), store.step_lock("k-with-read") as held, pytest.raises(RuntimeError), \
                store.tx() as conn:
            assert store.get_run(run_id, conn, lock=True) is not None
            if not held:
                raise RuntimeError("held elsewhere: the handling writes nothing")
    with store.handling(), store.step_lock("k-dropped") as held:  # never sent: its transaction ended unsent
        with pytest.raises(RuntimeError), store.tx() as conn:
            _note(conn, "d-never-sent")
            raise RuntimeError("failed before a round trip")
        assert not held, "a lock never asked for is not held"
    with store.step_lock("k-dropped", own_connection=True) as free:
        assert free


def test_an_intent_goes_with_the_next_read_or_its_commit(pg_store: Store, round_trips: list[str]) -> None:
    from agentfleet.store.steps import STEP

    store, key = pg_store, f"k-intent-{uuid.uuid4().hex}"
    with store.handling(), store.tx() as conn:
        intent = store.intend_step(conn, key=key, run_id="r-intent", iteration=0, kind="plan")
        assert execute(conn, STEP, {"key": "no-such-step"}).first() is None
        assert len(round_trips) == 1
        record = intent()
        assert (record.status, record.attempts, record.fresh) == ("started", 1, True) and len(round_trips) == 1
    round_trips.clear()
    with store.handling():
        again = store.begin_step(key=key, run_id="r-intent", iteration=0, kind="plan", durable=False)
        assert (again.status, again.attempts, again.fresh) == ("started", 2, False)
        assert round_trips == ["COMMIT"], "its own transaction: the intent went with the COMMIT"
        with store.tx() as conn:
            store.finish_step(conn, key, status="succeeded", output={"ok": True}, duration_ms=1.0)
        done = store.begin_step(key=key, run_id="r-intent", iteration=0, kind="plan")
        assert (done.status, done.attempts, done.output) == ("succeeded", 2, {"ok": True}), "read apart, as it was"


def test_a_step_lock_never_asked_for_costs_no_round_trip(
        pg_store: Store, round_trips: list[str], caplog: pytest.LogCaptureFixture) -> None:
    """A handling that fails before its first statement (Redis gave no answer, the goal did not fit) never asked for
    its step: nothing is sent to take a lock only to let it go, and nothing is left deferred behind."""
    store = pg_store
    with pytest.raises(RuntimeError), store.handling(), store.step_lock("k-unasked"):
        raise RuntimeError("failed before the first read")
    assert round_trips == []
    assert "still deferred" not in caplog.text
    with store.step_lock("k-unasked", own_connection=True) as free:
        assert free


def test_a_database_gone_with_a_step_lock_in_flight_fails_the_step_retryably_and_leaks_nothing(
        pg_store: Store) -> None:
    """The lock went with the read; the database dropped the session before they came back: the step fails with the
    transient error (not one from letting go of the lock), and the next handling takes the step."""
    store, run_id = pg_store, f"r-gone-{uuid.uuid4().hex}"
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
    with pytest.raises(DBAPIError) as failed, store.handling():
        with store.reading() as conn:
            pid = execute(conn, BACKEND_PID).scalar()
        with make_engine(str(store.engine.url.render_as_string(hide_password=False))).connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            admin.commit()
        with store.step_lock("k-gone") as held, store.tx() as conn:
            store.get_run(run_id, conn, lock=True)  # the lock, BEGIN and the read, on the dropped session
            assert held, "not reached: the read fails"
    assert is_transient(failed.value), failed.value
    with store.handling(), store.step_lock("k-gone") as held, store.tx() as conn:
        assert store.get_run(run_id, conn, lock=True) is not None
        assert held


def test_a_tool_steps_lock_goes_in_its_intents_statement_and_one_held_elsewhere_counts_no_attempt(
        pg_store: Store, round_trips: list[str]) -> None:
    """The executor's handling: the step lock, not asked before, is asked with the intent in one statement, sent
    alone (its own transaction: no BEGIN, no COMMIT); held elsewhere, nothing is written and no attempt counted; the
    lock goes with the step's last commit."""
    store, key = pg_store, f"k-tool-{uuid.uuid4().hex}"
    intent = dict(key=key, run_id="r-tool", iteration=0, kind="tool", call_id="c", name="t", input={"a": 1},
                  durable=False)
    with store.handling(), store.step_lock(key) as held:
        record = store.begin_step(**intent, hold=held)
        assert round_trips == ["(alone)"], round_trips
        assert record is not None and (record.status, record.attempts, record.fresh) == ("started", 1, True)
        assert held and len(round_trips) == 1
        with store.step_lock(key, own_connection=True) as elsewhere:
            assert not elsewhere
        round_trips.clear()

        def second_delivery() -> tuple[object, bool]:  # another handling, in another session
            with store.handling(), store.step_lock(key) as other:
                return store.begin_step(**intent, hold=other), bool(other)

        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(second_delivery).result() == (None, False)
        assert len(round_trips) == 1, round_trips
        with store.tx() as conn:
            store.finish_step(conn, key, status="succeeded", output={"ok": True}, duration_ms=1.0)
            store.release_held(conn)
    assert [(s["status"], s["attempts"]) for s in store.steps("r-tool") if s["idempotency_key"] == key] == [
        ("succeeded", 1)], "the delivery that found the step held counted no attempt"
    with store.handling(), store.step_lock(key) as again:
        done = store.begin_step(**intent, hold=again)
        assert done is not None and (done.status, done.attempts, done.output) == ("succeeded", 1, {"ok": True})
    with store.step_lock(key, own_connection=True) as free:
        assert free, "let go at the end"


def test_an_intent_stopped_after_its_lock_was_taken_lets_go_of_the_lock(pg_store: Store) -> None:
    """The intent's statement takes the step's lock first, then writes; stopped in between (here: cancelled while it
    waits on the step's row, which another session holds), it fails, and whether it holds the lock is unknown to the
    handling. A session's advisory lock outlives the statement: the handling lets go of it, and the step is free
    for the next delivery, not held by a pooled connection for ever."""
    store, key = pg_store, f"k-stopped-{uuid.uuid4().hex}"
    intent = dict(key=key, run_id="r-stopped", iteration=0, kind="tool", call_id="c", name="t", input={},
                  durable=False)
    with store.handling(), store.step_lock(key) as held:
        assert store.begin_step(**intent, hold=held) is not None  # started, never finished: the next one waits on it
    with store.engine.connect() as holder, ThreadPoolExecutor(1) as pool:
        holder.execute(text("SELECT 1 FROM steps WHERE idempotency_key = :k FOR UPDATE"), {"k": key})

        def delivery() -> BaseException | None:
            try:
                with store.handling(), store.step_lock(key) as again:
                    store.begin_step(**intent, hold=again)
            except DBAPIError as exc:
                return exc
            return None

        stopped = pool.submit(delivery)
        try:
            waiting = None
            with store.engine.connect() as watcher:
                for _ in range(500):
                    waiting = watcher.execute(text(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
                        "'%pg_try_advisory_lock%'")).scalar()
                    if waiting is not None:
                        break
                    watcher.rollback()
                    threading.Event().wait(0.01)
                assert waiting is not None, "the intent never waited on the held row"
                watcher.execute(text("SELECT pg_cancel_backend(:pid)"), {"pid": waiting})
            assert "canceling statement" in str(stopped.result(timeout=30))
        finally:
            holder.rollback()
    with store.step_lock(key, own_connection=True) as free:
        assert free, "the lock the stopped intent took went back to the pool with its connection"


FLUSH_STATS = Sql("SELECT pg_stat_force_next_flush()")


def _wal_syncs(store: Store) -> int:
    """The server's WAL flushes so far (every process's: the counts of this session's, and of the WAL writer's)."""
    with store.engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_force_next_flush()"))  # this session's counts, not up to a second late
        conn.commit()
        return int(conn.execute(text("SELECT wal_sync FROM pg_stat_wal")).scalar_one())


@pytest.mark.parametrize("durable", [True, False])
def test_a_tool_steps_intent_sent_alone_waits_for_the_disk_only_when_durable(pg_store: Store, durable: bool,
                                                                             round_trips: list[str]) -> None:
    """An intent with its lock goes as one statement in a transaction of its own. A repeatable call's (``durable``
    False) does not wait for the disk, as one in a relaxed transaction would not; any other call's does, and each
    flushes the WAL before its answer. Counted on the server: twenty intents, a flush each or next to none (the WAL
    writer's own, every 200 ms)."""
    store, n, keys = pg_store, 20, [f"k-sync-{uuid.uuid4().hex}" for _ in range(20)]
    before = _wal_syncs(store)
    for key in keys:
        with store.handling(), store.step_lock(key) as held:
            record = store.begin_step(key=key, run_id="r-sync", iteration=0, kind="tool", call_id="c", name="t",
                                      input={}, durable=durable, hold=held)
            assert record is not None and record.fresh and held
            with store.reading() as conn:  # the session's counts to the server's before the next statement's answer
                execute(conn, FLUSH_STATS)
    syncs = _wal_syncs(store) - before
    assert set(round_trips) == {"(alone)"}, round_trips
    if durable:
        assert syncs >= n, f"{syncs} WAL flushes for {n} durable intents"
    else:
        assert syncs <= n // 4, f"{syncs} WAL flushes for {n} intents that need not wait for the disk"
    with store.reading() as conn:
        assert execute(conn, SYNC_COMMIT).scalar() == "on", "the session's own setting is as it was"


def test_a_result_is_recorded_with_the_runs_locked_read_and_only_while_the_run_fans_in(
        pg_store: Store, round_trips: list[str]) -> None:
    """The observer's handling: its result goes in the round trip of the run's locked read, locked by the same
    statement, and is not recorded for a run that has moved on (a late result)."""
    store, run_id = pg_store, f"r-obs-{uuid.uuid4().hex}"
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
    with store.tx() as conn:
        run = store.get_run(run_id, conn, lock=True)
        assert run is not None
        run = store.transition(conn, run, RunState.PLANNING, iteration=1)
        assert run is not None and store.transition(conn, run, RunState.EXECUTING) is not None
    fanning = [str(RunState.EXECUTING), str(RunState.WAITING_APPROVAL)]
    round_trips.clear()
    with store.handling(), store.tx() as conn:
        noted = store.observe_while(conn, run_id=run_id, iteration=1, states=fanning, call_id="c1", tool="t",
                                    result={"ok": True})
        assert noted is not None and store.get_run(run_id, conn, lock=True) is not None
        assert len(round_trips) == 1 and noted.rows().first() == (1, 1)
        late = store.observe_while(conn, run_id=run_id, iteration=0, states=fanning, call_id="c0", tool="t",
                                   result={"ok": True})
        again = store.observe_while(conn, run_id=run_id, iteration=1, states=fanning, call_id="c1", tool="t",
                                    result={"ok": False})
        assert late is not None and again is not None and store.get_run(run_id, conn, lock=True) is not None
        assert late.rows().first() == (0, 0), "a result of an iteration the run has left is not recorded"
        assert again.rows().first() == (1, 0), "a result recorded once"
    with store.reading() as conn:
        assert [o["call_id"] for o in store.observations(conn, run_id, 1)] == ["c1"]
        assert store.observations(conn, run_id, 0) == []


def test_a_run_read_in_an_earlier_transaction_is_held_as_read_in_the_commits_round_trip_or_not_at_all(
        pg_store: Store, round_trips: list[str]) -> None:
    """The planner's second transaction: the run it read before the model call is held as it read it, checked with the
    COMMIT instead of read again (one round trip). Changed since, by a move (its version) or by what is written without
    one (a child's spend, a reservation, a redrive), the transaction fails whole with ``RunMovedOn``: none of its
    writes stays, and the caller reads the run again."""
    from agentfleet.loop.budgets import Reservation
    from agentfleet.loop.transcript import Usage
    from agentfleet.store.base import RunMovedOn

    store, run_id = Store(pg_store.engine, audit=True), f"r-as-read-{uuid.uuid4().hex}"
    with store.tx() as conn:
        created = store.start_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        read = store.transition(conn, created, RunState.PLANNING)
    assert read is not None
    round_trips.clear()
    with store.handling(), store.tx() as conn:
        held = store.hold_run(conn, read)
        assert held is read
        moved = store.transition(conn, read, RunState.EXECUTING, steps_used=read.steps_used + 1)
        assert moved is not None
        _note(conn, f"n-as-read-{run_id}")
    assert round_trips == ["COMMIT"], "the hold, the move, the write and the COMMIT: one round trip"
    now_run = store.get_run(run_id)
    assert now_run is not None and (now_run.state, now_run.version, now_run.steps_used) == (RunState.EXECUTING, 2, 1)

    changes = {
        "a child's spend": lambda conn: store.add_spend(conn, [run_id], Usage(input_tokens=7)),
        "a reservation": lambda conn: store.reserve(conn, [run_id], Reservation(10, 0.5, 1)),
        "a redrive": lambda conn: store.note_redrive(conn, run_id),
        "a thread's place": lambda conn: conn.execute(update(T.runs).where(T.runs.c.run_id == run_id)
                                                      .values(thread_seq=3)),
        "a move": lambda conn: store.transition(conn, store.get_run(run_id, conn, lock=True), RunState.OBSERVING),
    }
    for n, (what, change) in enumerate(changes.items()):
        read = store.get_run(run_id)
        assert read is not None
        with store.tx() as conn:
            change(conn)
        with pytest.raises(RunMovedOn), store.handling(), store.tx() as conn:
            store.hold_run(conn, read)
            store.transition(conn, read, RunState.CANCELLED if read.state != RunState.CANCELLED else RunState.FAILED)
            _note(conn, f"n-moved-{run_id}-{n}")
        after = store.get_run(run_id)
        assert after is not None and after.state != RunState.CANCELLED, f"after {what}: the move did not stay"
        with store.reading() as conn:
            assert execute(conn, NOTED, {"name": f"n-moved-{run_id}-{n}"}).scalar() is None, what
    with store.handling(), store.tx() as conn:  # read again, the same statements commit
        current = store.get_run(run_id, conn, lock=True)
        assert current is not None and store.transition(conn, current, RunState.CANCELLED) is not None
    assert [a["to_state"] for a in store.audit_trail(run_id)] == ["PLANNING", "EXECUTING", "OBSERVING", "CANCELLED"]


def test_a_lone_calls_result_on_a_run_known_from_its_event_goes_with_the_commit_or_fails_it_whole(
        pg_store: Store, round_trips: list[str]) -> None:
    """The observer's fan-in of an iteration's one call on the run as the call's result carries it: the hold, the
    result, the move and the COMMIT in one round trip. A run known wrong on its state or iteration at the right version
    (a carried record that is wrong), or a result of the call there already, fails the transaction whole."""
    import dataclasses

    from agentfleet.store.base import RunMovedOn

    store, run_id = pg_store, f"r-lone-{uuid.uuid4().hex}"
    with store.tx() as conn:
        created = store.start_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        planning = store.transition(conn, created, RunState.PLANNING)
        assert planning is not None
        known = store.transition(conn, planning, RunState.EXECUTING)
    assert known is not None

    def fan_in(run: object, call_id: str, name: str) -> None:
        with store.handling(), store.tx() as conn:
            held = store.hold_run(conn, run)  # type: ignore[arg-type]
            assert held is run
            store.record_first_observation(conn, run_id=run_id, iteration=0, call_id=call_id, tool="t",
                                           result={"ok": True, "output": name})
            assert store.transition(conn, held, RunState.OBSERVING) is not None  # type: ignore[arg-type]
            _note(conn, name)

    for wrong in (dataclasses.replace(known, state=RunState.WAITING_APPROVAL), dataclasses.replace(known, iteration=1)):
        with pytest.raises(RunMovedOn):
            fan_in(wrong, "c0", f"n-wrong-{run_id}")
    with store.tx() as conn:  # a result there before
        assert store.record_observation(conn, run_id=run_id, iteration=0, call_id="c1", tool="t",
                                        result={"ok": True, "output": "first"})
    with pytest.raises(RunMovedOn):
        fan_in(known, "c1", f"n-second-{run_id}")
    with store.reading() as conn:
        assert execute(conn, NOTED, {"name": f"n-wrong-{run_id}"}).scalar() is None
        assert execute(conn, NOTED, {"name": f"n-second-{run_id}"}).scalar() is None
        assert [o["result"]["output"] for o in store.observations(conn, run_id, 0)] == ["first"]
    assert store.get_run(run_id).state == RunState.EXECUTING  # type: ignore[union-attr]
    round_trips.clear()
    fan_in(known, "c0", f"n-lone-{run_id}")
    assert round_trips == ["COMMIT"], "the hold, the result, the move, the write and the COMMIT: one round trip"
    with store.reading() as conn:
        assert sorted(o["call_id"] for o in store.observations(conn, run_id, 0)) == ["c0", "c1"]
    assert store.get_run(run_id).state == RunState.OBSERVING  # type: ignore[union-attr]


def test_the_planners_intent_and_transcript_read_go_with_its_commit(pg_store: Store, round_trips: list[str]) -> None:
    """The planner's first transaction, after the run's locked read: the move, the intent, the transcript's read and
    the COMMIT in one round trip; the intent's record and the transcript are there once it is back."""
    store, run_id = pg_store, f"r-first-{uuid.uuid4().hex}"
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        store.write_messages(conn, run_id, [(0, 0, Message(role="assistant", content="turn 0")),
                                            (0, 1, Message(role="tool", tool_call_id="c", name="t", content="r"))])
    with store.handling(), store.tx() as conn:
        run = store.get_run(run_id, conn, lock=True)
        assert run is not None
        round_trips.clear()
        store.transition(conn, run, RunState.PLANNING, iteration=1)
        intent = store.intend_step(conn, key=f"{run_id}:1:plan", run_id=run_id, iteration=1, kind="plan")
        read = store.history_later(run_id, conn)
        store.relax(conn)
    assert round_trips == ["COMMIT"], round_trips
    record = intent()
    assert (record.status, record.attempts) == ("started", 1)
    assert [m.content for m in read().messages] == ["turn 0", "r"] and round_trips == ["COMMIT"]


PREPARED_HERE = Sql("SELECT count(*) FROM pg_prepared_statements")


def test_a_handlings_statements_are_prepared_once_a_connection_and_each_answer_is_read_right(
        pg_store: Store) -> None:
    """A statement's Parse goes in the round trip of its first use on a connection and never again there (the
    server keeps it past a ROLLBACK or a failed round trip); the answers still come back each to its own
    question, and a failed round trip leaves nothing behind that the next one would read."""
    store = pg_store

    def one(n: int) -> tuple[object, ...]:
        with store.tx() as conn:
            _note(conn, f"c-{n}-{uuid.uuid4().hex}", str(n))
            first = store.history_later(f"r-none-{n}", conn)
            asked = defer(conn, Sql("SELECT :n::int + 1"), {"n": n}, keep=True)
            _note(conn, f"c2-{n}-{uuid.uuid4().hex}", str(n))
        return first().messages, asked.rows().scalar()

    with store.handling():
        assert one(0) == ([], 1)
        with store.reading() as conn:
            prepared = execute(conn, PREPARED_HERE).scalar()
        assert [one(n) for n in range(1, 20)] == [([], n + 1) for n in range(1, 20)]
        with pytest.raises(DBAPIError), store.tx() as conn:
            execute(conn, Sql("SELECT 1 / (:n::int - :n::int)"), {"n": 1})
        assert one(20) == ([], 21), "a round trip after a failed one reads its own answers"
        with store.reading() as conn:
            assert execute(conn, PREPARED_HERE).scalar() == prepared + 1, "only the division, new, whose run failed"


@pytest.mark.parametrize("made_by", ["make_engine", "create_engine"])
def test_sqlalchemys_statements_and_rollbacks_never_take_the_stores_prepared_statements_away(
        pg_url: str, made_by: str) -> None:
    """psycopg prepares a statement it has run five times, and on a ROLLBACK with any of its own prepared it sends
    ``DEALLOCATE ALL``, which took the store's statements with it: the next use failed ("prepared statement … does
    not exist") and cost a step and a connection (seen under duplicate deliveries, whose transactions roll back).
    psycopg prepares nothing on the store's connections, whoever made the engine."""
    from sqlalchemy import create_engine

    engine = make_engine(pg_url) if made_by == "make_engine" else create_engine(pg_url)
    store = Store(engine)
    try:
        for _ in range(6):  # SQLAlchemy's own statement, often enough for psycopg to prepare it, beside the store's
            with store.tx() as conn:
                conn.execute(select(T.runs.c.run_id).where(T.runs.c.run_id == "r-none")).all()
                execute(conn, NOTED, {"name": "d-none"})
        with pytest.raises(RuntimeError), store.tx() as conn:  # rolled back by psycopg
            conn.execute(select(T.runs.c.run_id).where(T.runs.c.run_id == "r-none")).all()
            raise RuntimeError("rolled back")
        with store.tx() as conn:
            assert execute(conn, NOTED, {"name": "d-none"}).first() is None
            assert not conn.invalidated
    finally:
        engine.dispose()


def test_every_statement_of_the_hot_path_prepares_with_its_parameters_types_left_to_the_server(
        pg_store: Store) -> None:
    """Statements are prepared without parameter types, as psycopg sends a str: Postgres infers each from where it
    is used, and a value goes as text that the inferred type reads. A statement where it cannot infer one would fail
    at its first use in a running fleet; every module-level statement is prepared here first."""
    import importlib
    import pkgutil

    import agentfleet
    from agentfleet.store.sql import POSTGRES

    found = {}
    for module in pkgutil.walk_packages(agentfleet.store.__path__, "agentfleet.store."):
        if ".migrations" in module.name:  # alembic's scripts run only under alembic
            continue
        for name, value in vars(importlib.import_module(module.name)).items():
            if isinstance(value, Sql):
                found[f"{module.name}.{name}"] = value
    assert len(found) >= 15, found
    dbapi = pg_store.engine.raw_connection()
    try:
        for name, stmt in found.items():
            result = dbapi.driver_connection.pgconn.prepare(name.encode(), stmt.rendered(POSTGRES).encode())
            assert result.status == 1, (name, result.error_message)  # COMMAND_OK
    finally:
        dbapi.invalidate()


def test_statements_in_a_transaction_sqlalchemy_began_are_in_it(pg_store: Store) -> None:
    """Outside a handling, the connection is psycopg's, not in autocommit, and its BEGIN is sent by its cursor with
    the first statement: sent through libpq, the store's own statements get that BEGIN first, so that a rollback
    takes them back and a commit keeps them."""
    store, name = pg_store, f"d-began-{uuid.uuid4().hex}"
    with pytest.raises(RuntimeError), store.engine.begin() as conn:
        execute(conn, NOTE, {"name": name, "value": "v", "at": datetime.now(UTC)})
        raise RuntimeError("rolled back")
    with store.engine.begin() as conn:
        assert execute(conn, NOTED, {"name": name}).first() is None
        execute(conn, NOTE, {"name": name, "value": "kept", "at": datetime.now(UTC)})
        conn.execute(text("SELECT 1"))  # SQLAlchemy's own statement in the same transaction
    with store.reading() as conn:
        assert execute(conn, NOTED, {"name": name}).scalar() == "kept"


def test_a_round_trip_stopped_between_sending_and_reading_drops_its_connection_and_the_next_handling_works(
        pg_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped inside the wait (a signal's exception, a timeout thrown into the thread), a round trip leaves its
    connection mid-pipeline with answers unread: it is not handed back to the pool, the exception is the caller's,
    and nothing deferred stays behind."""
    import psycopg

    store, name = pg_store, f"d-stopped-{uuid.uuid4().hex}"
    wait = psycopg.Connection.wait

    def stopped(self: psycopg.Connection, gen: object, *args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt("stopped in the wait")

    with store.handling():
        with store.reading() as conn:
            pid = execute(conn, BACKEND_PID).scalar()
        monkeypatch.setattr(psycopg.Connection, "wait", stopped)
        with pytest.raises(KeyboardInterrupt), store.tx() as conn:
            _note(conn, name)
            execute(conn, NOTED, {"name": name})
        monkeypatch.setattr(psycopg.Connection, "wait", wait)
        assert conn.invalidated
    with store.handling(), store.tx() as conn:
        assert execute(conn, BACKEND_PID).scalar() != pid
        assert execute(conn, NOTED, {"name": name}).first() is None


def test_a_hold_that_fails_on_a_fresh_connection_leaves_its_statements_usable_for_the_read_again(pg_url: str) -> None:
    """The first round trip of a new connection fails at the hold, before the writes behind it were ever prepared
    there: the transaction run again on a fresh read, on the same connection, sends the same statements and commits
    (no statement psycopg thinks prepared while the server skipped it, no cursor left in a failed state)."""
    from agentfleet.loop.transcript import Usage
    from agentfleet.store.base import RunMovedOn

    run_id = f"r-fresh-{uuid.uuid4().hex}"
    setup = Store(make_engine(pg_url), audit=True)
    with setup.tx() as conn:
        created = setup.start_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        read = setup.transition(conn, created, RunState.PLANNING)
        setup.add_spend(conn, [run_id], Usage(input_tokens=3))  # changed since ``read``
    setup.engine.dispose()
    engine = make_engine(pg_url)
    store = Store(engine, audit=True)
    assert read is not None

    def second(known: object) -> None:
        with store.tx() as conn:
            current = store.hold_run(conn, read) if known else store.get_run(run_id, conn, lock=True)
            assert current is not None
            store.write_messages(conn, run_id, [(0, 0, Message(role="assistant", content="turn"))])
            store.finish_step(conn, f"{run_id}:0:plan", status="succeeded", output={}, duration_ms=1.0)
            store.transition(conn, current, RunState.EXECUTING, steps_used=current.steps_used + 1)
            store.mark_processed(conn, uuid.uuid4().hex, "planner", [], run_id=run_id, deferred=True)

    try:
        with store.handling():
            with pytest.raises(RunMovedOn):
                second(read)
            second(None)
        moved = store.get_run(run_id)
        assert moved is not None and (moved.state, moved.steps_used, moved.input_tokens) == (
            RunState.EXECUTING, 2, 3)
        assert [m.content for m in store.transcript(run_id)] == ["turn"]
    finally:
        engine.dispose()


def _lock_is_free(store: Store, key: str) -> bool:
    """Whether another session can take the step's lock now (asked on a connection of its own engine: a session's
    advisory locks are re-entrant, so one the pool hands back must not be the one asking)."""
    from agentfleet.store.base import TRY_LOCK, UNLOCK, lock_id

    engine = make_engine(str(store.engine.url.render_as_string(hide_password=False)))
    try:
        with engine.connect() as conn:
            free = bool(execute(conn, TRY_LOCK, {"k": lock_id(key)}).scalar())
            if free:
                execute(conn, UNLOCK, {"k": lock_id(key)})
            conn.commit()
            return free
    finally:
        engine.dispose()


def test_a_step_lock_taken_in_a_round_trip_that_then_failed_is_let_go(pg_store: Store) -> None:
    """The lock's try went first in the round trip and was taken; a statement behind it failed. A session's advisory
    lock stays taken through the rollback: its answer is kept, and the lock let go at the end, not left on a pooled
    connection where no step of it could run again."""
    store, key = pg_store, f"k-failed-behind-{uuid.uuid4().hex}"
    with store.handling(), store.step_lock(key) as held:
        with pytest.raises(DBAPIError), store.tx() as conn:
            execute(conn, Sql("SELECT 1 / (SELECT count(*) FROM fleet_secrets WHERE name = 'no such name')"))
        assert held, "its answer came back before the failure"
    assert _lock_is_free(store, key)


def test_a_run_taken_as_its_last_mover_left_it_is_held_with_the_steps_lock_in_the_commits_round_trip_or_not_at_all(
        pg_store: Store, round_trips: list[str]) -> None:
    """The planner's first transaction, when it knows the run without reading it (as its own last commit left it,
    moved on by the observer as the event says): the row held as taken and the step's lock taken in one statement,
    sent with the move, the writes and the COMMIT (one round trip). The row not as taken (another state at that
    version, a spend) or the step held elsewhere: the transaction fails whole with ``RunMovedOn``, nothing written
    and no lock taken; the lock asked again goes with the next read."""
    import dataclasses

    from agentfleet.store.base import RunMovedOn

    store, run_id = Store(pg_store.engine, audit=True), f"r-taken-{uuid.uuid4().hex}"
    key = f"{run_id}:1:plan"
    with store.tx() as conn:
        created = store.start_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        planning = store.transition(conn, created, RunState.PLANNING)
        assert planning is not None
        left = store.transition(conn, planning, RunState.EXECUTING, steps_used=1)  # as the planner left it
    assert left is not None
    with store.tx() as conn:  # the observer's move
        assert store.transition(conn, store.get_run(run_id, conn, lock=True), RunState.OBSERVING) is not None
    taken = dataclasses.replace(left, state=RunState.OBSERVING, version=left.version + 1)

    wrong = {
        "another state at that version": dataclasses.replace(taken, state=RunState.CANCELLED),
        "an older version": left,
        "another spend": dataclasses.replace(taken, steps_used=2),
    }
    for n, (what, guess) in enumerate(wrong.items()):
        with store.handling(), store.step_lock(key) as held:
            with pytest.raises(RunMovedOn), store.tx() as conn:
                assert store.hold_and_lock(conn, guess, held)
                store.transition(conn, guess, RunState.PLANNING, iteration=1)
                _note(conn, f"n-taken-{run_id}-{n}")
            assert _lock_is_free(store, key), f"{what}: no lock taken"
            held.ask_again()
            round_trips.clear()
            with store.tx() as conn:
                assert store.get_run(run_id, conn, lock=True) == dataclasses.replace(taken, updated_at=ANY_TIME)
                assert len(round_trips) == 1 and held, f"{what}: asked again, with the read"
        with store.reading() as conn:
            assert execute(conn, NOTED, {"name": f"n-taken-{run_id}-{n}"}).scalar() is None, what

    with store.step_lock(key, own_connection=True) as elsewhere:
        assert elsewhere
        with store.handling(), store.step_lock(key) as held:
            with pytest.raises(RunMovedOn), store.tx() as conn:
                assert store.hold_and_lock(conn, taken, held)
                store.transition(conn, taken, RunState.PLANNING, iteration=1)
            held.ask_again()
            assert not held, "held elsewhere, and still"
    current = store.get_run(run_id)
    assert current is not None and (current.state, current.version) == (RunState.OBSERVING, taken.version)

    round_trips.clear()
    with store.handling(), store.step_lock(key) as held:
        with store.tx() as conn:
            assert store.hold_and_lock(conn, taken, held)
            moved = store.transition(conn, taken, RunState.PLANNING, iteration=1)
            _note(conn, f"n-taken-{run_id}")
        assert round_trips == ["COMMIT"], "the hold, the lock, the move, the write and the COMMIT: one round trip"
        assert held and len(round_trips) == 1
        assert not _lock_is_free(store, key)
    assert _lock_is_free(store, key), "let go at the end"
    assert moved is not None and store.get_run(run_id) == dataclasses.replace(moved, updated_at=ANY_TIME)
    assert [a["to_state"] for a in store.audit_trail(run_id)] == ["PLANNING", "EXECUTING", "OBSERVING", "PLANNING"]


class _AnyTime:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, datetime)


ANY_TIME: datetime = _AnyTime()  # type: ignore[assignment]
