"""Steps, checkpointed write-ahead under their idempotency keys: begun before their side effects, finished after."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import StepRecord, now


class Steps(StoreBase):
    """Steps checkpointed under their idempotency keys."""

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
    ) -> StepRecord:
        """Record the intent before any side effect; an existing unfinished intent counts an attempt."""
        with self.tx() as conn:
            fresh = self._insert_ignore(
                conn,
                T.steps,
                dict(idempotency_key=key, run_id=run_id, iteration=iteration, kind=kind, call_id=call_id,
                     name=name, status="started", attempts=1, input=input, worker=worker, started_at=now()),
                ["idempotency_key"],
            )
            if fresh:  # the row is what was just inserted: no need to read it back
                return StepRecord(key, "started", 1, None, fresh=True, input=input)
            conn.execute(
                update(T.steps)
                .where(T.steps.c.idempotency_key == key, T.steps.c.status == "started")
                .values(attempts=T.steps.c.attempts + 1, worker=worker, started_at=now())
            )
            row = conn.execute(select(T.steps).where(T.steps.c.idempotency_key == key)).one()
        return StepRecord(key, row.status, row.attempts, row.output, fresh=False, input=row.input)

    def record_step(self, conn: Connection, *, key: str, run_id: str, iteration: int, call_id: str, name: str,
                    input: Any, worker: str | None, status: str, output: Any) -> None:
        """A step begun and finished at once, in the caller's transaction (a call the planner answers)."""
        ts = now()
        self._insert_ignore(conn, T.steps, dict(
            idempotency_key=key, run_id=run_id, iteration=iteration, kind="tool", call_id=call_id, name=name,
            status=status, attempts=1, input=input, output=output, worker=worker, started_at=ts, finished_at=ts,
            duration_ms=0.0), ["idempotency_key"])

    def finish_step(self, conn: Connection, key: str, *, status: str, output: Any, duration_ms: float) -> None:
        conn.execute(
            update(T.steps)
            .where(T.steps.c.idempotency_key == key)
            .values(status=status, output=output, finished_at=now(), duration_ms=duration_ms)
        )

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(T.steps).where(T.steps.c.run_id == run_id).order_by(T.steps.c.id)).all()
        return [dict(r._mapping) for r in rows]

    def set_step_input(self, conn: Connection, key: str, value: Any) -> None:
        conn.execute(update(T.steps).where(T.steps.c.idempotency_key == key).values(input=value))

    def step_input(self, conn: Connection, key: str, *, lock: bool = False) -> Any:
        stmt = select(T.steps.c.input).where(T.steps.c.idempotency_key == key)
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).scalar()

    def open_steps(self, run_id: str) -> list[str]:
        """Idempotency keys of the run's steps whose intent has no outcome yet."""
        with self.engine.connect() as conn:
            return list(conn.execute(
                select(T.steps.c.idempotency_key).where(T.steps.c.run_id == run_id, T.steps.c.status == "started")
            ).scalars().all())

    def step_held(self, key: str) -> bool:
        """Whether a live worker holds the step right now (its lock is taken)."""
        with self.step_lock(key) as got:
            return not got

    def delegated_calls(self, conn: Connection, run_id: str, iteration: int) -> set[str]:
        """Calls of an iteration handed to child runs, whose answers have not all come back."""
        s = T.steps.c
        stmt = select(s.call_id).where(s.run_id == run_id, s.iteration == iteration, s.kind == "tool",
                                       s.status == "delegated")
        return {row[0] for row in conn.execute(stmt).all()}
