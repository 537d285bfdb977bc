"""Steps, checkpointed write-ahead under their idempotency keys: begun before their side effects, finished after."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, overload

from sqlalchemy import Connection, select, update

from agentfleet.store import tables as T
from agentfleet.store.base import RELAXED_IF, StepHold, StoreBase, lock_id
from agentfleet.store.records import StepRecord, as_utc, now
from agentfleet.store.sql import Sql, defer, execute

# The intent, or one more attempt at it: one statement either way. A finished step is left as it is (no row
# comes back, and it is read). ``attempts``: those a first intent counts (``begin_step``).
BEGIN_STEP = Sql(
    "INSERT INTO steps (idempotency_key, run_id, iteration, kind, call_id, name, status, attempts, input, worker, "
    "started_at) VALUES (:key, :run_id, :iteration, :kind, :call_id, :name, 'started', :attempts, :input, :worker, "
    ":at) "
    "ON CONFLICT (idempotency_key) DO UPDATE SET attempts = steps.attempts + 1, worker = excluded.worker, "
    "started_at = excluded.started_at WHERE steps.status = 'started' "
    "RETURNING status, attempts, output, input",
    json=frozenset({"input"}), times=frozenset({"at"}), result=(None, None, "json", "json"))
# The same, made only if this session takes the step's lock (``pg_try_advisory_lock``, in the same statement):
# the lock's answer first, then the intent's row (none: held elsewhere and nothing written, or finished). Sent alone,
# a transaction of its own, whose commit ``relaxed`` relaxes (``RELAXED_IF``).
HELD_BEGIN_STEP = Sql(
    f"WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock(:k) AS held, {RELAXED_IF} AS commits), intent AS ("
    "INSERT INTO steps (idempotency_key, run_id, iteration, kind, call_id, name, status, attempts, input, worker, "
    "started_at) SELECT :key, :run_id, :iteration, :kind, :call_id, :name, 'started', :attempts, :input, :worker, :at "
    "FROM lock WHERE lock.held "
    "ON CONFLICT (idempotency_key) DO UPDATE SET attempts = steps.attempts + 1, worker = excluded.worker, "
    "started_at = excluded.started_at WHERE steps.status = 'started' "
    "RETURNING status, attempts, output, input) "
    "SELECT lock.held, intent.status, intent.attempts, intent.output, intent.input FROM lock LEFT JOIN intent ON true",
    json=frozenset({"input"}), times=frozenset({"at"}), result=(None, None, None, "json", "json"), rows=True)
STEP = Sql("SELECT status, attempts, output, input FROM steps WHERE idempotency_key = :key",
           result=(None, None, "json", "json"))
# A step begun and finished at once (``record_step``). An intent a redelivered attempt left is finished by it; a
# finished step is left as it is.
DONE_STEP = Sql(
    "INSERT INTO steps (idempotency_key, run_id, iteration, kind, call_id, name, status, attempts, input, output, "
    "worker, started_at, finished_at, duration_ms) VALUES (:key, :run_id, :iteration, :kind, :call_id, :name, "
    ":status, 1, :input, :output, :worker, :started_at, :at, :duration_ms) "
    "ON CONFLICT (idempotency_key) DO UPDATE SET status = excluded.status, output = excluded.output, "
    "finished_at = excluded.finished_at, duration_ms = excluded.duration_ms WHERE steps.status = 'started'",
    json=frozenset({"input", "output"}), times=frozenset({"started_at", "at"}))
FINISH_STEP = Sql(
    "UPDATE steps SET status = :status, output = :output, finished_at = :at, duration_ms = :duration_ms "
    "WHERE idempotency_key = :key", json=frozenset({"output"}), times=frozenset({"at"}))


class Steps(StoreBase):
    """Steps checkpointed under their idempotency keys."""

    @overload
    def begin_step(self, *, key: str, run_id: str, iteration: int, kind: str, call_id: str = "", name: str = "",
                   input: Any = None, worker: str | None = None, durable: bool = True, conn: Connection | None = None,
                   hold: Literal[True] = True, attempts: int = 1) -> StepRecord: ...
    @overload
    def begin_step(self, *, key: str, run_id: str, iteration: int, kind: str, call_id: str = "", name: str = "",
                   input: Any = None, worker: str | None = None, durable: bool = True, conn: Connection | None = None,
                   hold: bool | StepHold, attempts: int = 1) -> StepRecord | None: ...
    def begin_step(
        self,
        *,
        key: str,
        run_id: str,
        iteration: int,
        kind: str,
        call_id: str = "",
        name: str = "",
        input: Any = None,
        worker: str | None = None,
        durable: bool = True,
        conn: Connection | None = None,
        hold: bool | StepHold = True,
        attempts: int = 1,
    ) -> StepRecord | None:
        """Record the intent before any side effect; an existing unfinished intent counts an attempt.

        In ``conn``'s transaction, or in one of its own, which with ``durable=False`` does not wait for the disk:
        for an intent whose loss in a database crash only means the step runs again as a first attempt (a model
        turn, an idempotent tool; ``StoreBase.relax``). ``hold``: the step's lock (``step_lock``); one not asked
        for yet is asked in the intent's own statement, which writes nothing unless it was taken (one round trip
        instead of two). None, with nothing written, when the step is held elsewhere. ``attempts``: those a first
        intent counts: 2 for a call an attempt that wrote nothing may have run before (``roles/executor.py``).
        """
        if isinstance(hold, StepHold) and hold.pending and conn is None:
            # Alone, not in BEGIN … COMMIT: one statement is its own transaction (three statements fewer).
            later = hold.ask_alone(HELD_BEGIN_STEP, dict(
                k=lock_id(key), relaxed=not durable, key=key, run_id=run_id, iteration=iteration, kind=kind,
                call_id=call_id, name=name, input=input, worker=worker, at=now(), attempts=attempts))
            if later is not None:
                if not hold:
                    return None
                _, *intent = later.rows().first()  # one row, always: the lock's answer, then the intent's
                return self._step_record(key, intent if intent[0] is not None else None, None)
        if not hold:
            return None
        if conn is not None:
            return self.intend_step(conn, key=key, run_id=run_id, iteration=iteration, kind=kind, call_id=call_id,
                                    name=name, input=input, worker=worker, attempts=attempts)()
        with self.tx(durable=durable) as own:  # the intent goes with the COMMIT: one round trip
            intent = self.intend_step(own, key=key, run_id=run_id, iteration=iteration, kind=kind, call_id=call_id,
                                      name=name, input=input, worker=worker, attempts=attempts)
        return intent()

    def intend_step(self, conn: Connection, *, key: str, run_id: str, iteration: int, kind: str, call_id: str = "",
                    name: str = "", input: Any = None, worker: str | None = None,
                    attempts: int = 1) -> Callable[[], StepRecord]:
        """``begin_step`` in ``conn``'s transaction, sent with the next statement (a read the caller needs anyway, or
        the COMMIT); the record once that is back. A finished step's record is read then, apart."""
        values = dict(key=key, run_id=run_id, iteration=iteration, kind=kind, call_id=call_id, name=name,
                      input=input, worker=worker, at=now(), attempts=attempts)
        later = defer(conn, BEGIN_STEP, values, keep=True)
        return lambda: self._step_record(key, later.rows().first(), conn)

    def _step_record(self, key: str, row: Sequence[Any] | None, conn: Connection | None) -> StepRecord:
        """The step as its intent left it: ``row`` as the intent returned it, or (none: a finished step) read, in
        ``conn``'s transaction while it is open."""
        if row is None and conn is not None and self.in_tx(conn):
            row = execute(conn, STEP, {"key": key}).first()
        elif row is None:
            with self.reading() as read:
                row = execute(read, STEP, {"key": key}).first()
        assert row is not None, "an intent just written or found"
        status, attempts, output, recorded = row
        return StepRecord(key, status, attempts, output, fresh=status == "started" and attempts == 1,
                          input=recorded)

    def record_step(self, conn: Connection, *, key: str, run_id: str, iteration: int, call_id: str, name: str,
                    input: Any, worker: str | None, status: str, output: Any, started_at: datetime | None = None,
                    duration_ms: float = 0.0, kind: str = "tool") -> None:
        """A step begun and finished at once, in the caller's transaction, sent with its next statement (the COMMIT):
        a call the planner answers, one whose tool may run again with no harm and so ran before anything of it was
        written (``roles/executor.py``), or a plan whose model was asked first (``roles/planner.py``). An intent a
        redelivered attempt left is finished by it; a finished step is left as it is."""
        at = now()
        defer(conn, DONE_STEP, dict(key=key, run_id=run_id, iteration=iteration, kind=kind, call_id=call_id,
                                    name=name, status=status, input=input, output=output, worker=worker,
                                    started_at=started_at or at, at=at, duration_ms=duration_ms))

    def finish_step(self, conn: Connection, key: str, *, status: str, output: Any, duration_ms: float) -> None:
        defer(conn, FINISH_STEP, {"key": key, "status": status, "output": output, "at": now(),
                                  "duration_ms": duration_ms})

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        with self.reading() as conn:
            rows = conn.execute(select(T.steps).where(T.steps.c.run_id == run_id).order_by(T.steps.c.id)).all()
        return [dict(r._mapping) for r in rows]

    def recent_steps(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` finished steps (run, iteration, kind, start, duration in ms), newest first: read
        backwards along the primary key, so the cost is the limit's, not the table's."""
        c = T.steps.c
        stmt = (select(c.run_id, c.iteration, c.kind, c.started_at, c.duration_ms).where(c.duration_ms.is_not(None))
                .order_by(c.id.desc()).limit(limit))
        with self.reading() as conn:
            return [{"run_id": r.run_id, "iteration": r.iteration, "kind": str(r.kind),
                     "started_at": as_utc(r.started_at), "duration_ms": float(r.duration_ms)}
                    for r in conn.execute(stmt).all()]

    def set_step_input(self, conn: Connection, key: str, value: Any) -> None:
        conn.execute(update(T.steps).where(T.steps.c.idempotency_key == key).values(input=value))

    def step_input(self, conn: Connection, key: str, *, lock: bool = False) -> Any:
        stmt = select(T.steps.c.input).where(T.steps.c.idempotency_key == key)
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).scalar()

    def step_output(self, conn: Connection, key: str) -> Any:
        return conn.execute(select(T.steps.c.output).where(T.steps.c.idempotency_key == key)).scalar()

    def open_steps(self, run_id: str) -> list[str]:
        """Idempotency keys of the run's steps whose intent has no outcome yet."""
        with self.reading() as conn:
            return list(conn.execute(
                select(T.steps.c.idempotency_key).where(T.steps.c.run_id == run_id, T.steps.c.status == "started")
            ).scalars().all())

    def step_held(self, key: str) -> bool:
        """Whether a live worker holds the step right now (its lock is taken)."""
        with self.step_lock(key, own_connection=True) as got:
            return not got

    def delegated_calls(self, conn: Connection, run_id: str, iteration: int) -> set[str]:
        """Calls of an iteration handed to child runs, whose answers have not all come back."""
        s = T.steps.c
        stmt = select(s.call_id).where(s.run_id == run_id, s.iteration == iteration, s.kind == "tool",
                                       s.status == "delegated")
        return {row[0] for row in conn.execute(stmt).all()}
