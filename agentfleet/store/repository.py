"""The only place that reads and writes the tables.

Handlers pass a connection for writes that must commit together (a step's
outcome, the run's transition and the events to publish); reads that stand
alone open their own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

from sqlalchemy import Connection, Engine, Text, cast, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from agentfleet.constants import DEFAULT_DEADLINE_S
from agentfleet.harness.redaction import redact
from agentfleet.hooks.base import Hooks, Transition
from agentfleet.loop.budgets import Reservation
from agentfleet.loop.states import TERMINAL, RunState, can_transition
from agentfleet.loop.transcript import MESSAGES, Message, Usage
from agentfleet.store import tables as T

log = logging.getLogger(__name__)
ARTIFACT_CHUNK = 1 << 20  # bytes a row of artifact_chunks holds
Payload = bytes | BinaryIO  # an artifact's content: bytes, or a file the store streams in


def now() -> datetime:
    return datetime.now(UTC)


def _utc(ts: datetime | None) -> datetime | None:
    """SQLite drops the zone; we only ever store UTC."""
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


def lock_id(key: str) -> int:
    """The Postgres advisory lock that holds the step with idempotency key ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    agent: str
    goal_id: str
    trace_id: str
    state: RunState
    version: int
    iteration: int
    input: dict[str, Any]
    limits: dict[str, Any]
    steps_used: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    result: dict[str, Any] | None
    error_code: str | None
    created_at: datetime
    updated_at: datetime
    redrives: int = 0
    redriven_at: datetime | None = None
    cached_input_tokens: int = 0
    unpriced: bool = False
    parent_run_id: str | None = None
    parent: dict[str, Any] | None = None
    cause: dict[str, Any] | None = None
    reserved_tokens: int = 0
    reserved_cost_usd: float = 0.0
    reserved_steps: int = 0

    @classmethod
    def from_row(cls, row: Any) -> RunRecord:
        data = dict(row._mapping)
        data["state"] = RunState(data["state"])
        for key in ("created_at", "updated_at", "redriven_at"):
            data[key] = _utc(data[key])
        return cls(**data)

    @property
    def usage(self) -> Usage:
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens, cost_usd=self.cost_usd,
                     cached_input_tokens=self.cached_input_tokens, unpriced=self.unpriced)

    def usage_summary(self) -> dict[str, Any]:
        """The run's usage as a Result and ``agentfleet status`` report it."""
        return {"steps": self.steps_used, "tokens": self.input_tokens + self.output_tokens, "cost_usd": self.cost_usd,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_input_tokens": self.cached_input_tokens, "unpriced": self.unpriced}

    def elapsed_s(self) -> float:
        return (now() - self.created_at).total_seconds()

    def deadline_at(self) -> datetime:
        """When the run's wall-time budget ends (a delegated run's limits are already within its ancestors')."""
        return self.created_at + timedelta(seconds=float(self.limits.get("deadline_s") or DEFAULT_DEADLINE_S))

    def past_deadline(self) -> bool:
        return now() >= self.deadline_at()

    @property
    def ancestors(self) -> list[str]:
        """The runs above a delegated run, the root first: each counts this run's spend in its own."""
        if not self.parent:
            return []
        return list(self.parent.get("ancestors") or [self.parent["run_id"]])


@dataclass(frozen=True)
class StepRecord:
    idempotency_key: str
    status: str
    attempts: int
    output: Any
    fresh: bool  # this call created the intent (no earlier attempt)
    input: Any = None  # what the intent recorded (the first attempt's)


@dataclass(frozen=True)
class ApprovalRecord:
    """A tool call parked for a person's answer, and the answer once there is one."""

    approval_id: str
    run_id: str
    iteration: int
    call_id: str
    agent: str
    tool: str
    arguments: dict[str, Any]
    shown: dict[str, Any]
    args_schema: dict[str, Any]
    request: dict[str, Any]
    rule: str
    reason: str
    status: str
    requested_at: datetime
    expires_at: datetime | None
    resolved_at: datetime | None
    resolved_by: str | None
    note: str | None
    edited_arguments: dict[str, Any] | None
    sent_at: datetime | None
    applied_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> ApprovalRecord:
        data = {k: v for k, v in row._mapping.items() if k in cls.__dataclass_fields__}
        for key in ("requested_at", "expires_at", "resolved_at", "sent_at", "applied_at"):
            data[key] = _utc(data[key])
        return cls(**data)

    @property
    def pending(self) -> bool:
        return self.status == APPROVAL_PENDING

    def summary(self) -> dict[str, Any]:
        """What people see: the arguments (and any edits) with secrets masked."""
        data = dataclasses.asdict(self)
        for key in ("arguments", "args_schema", "request"):
            data.pop(key)
        if self.edited_arguments is not None:
            data["edited_arguments"] = redact(self.edited_arguments, self.args_schema)
        return data


APPROVAL_PENDING = "pending"
LIVE = T.runs.c.state.notin_([s.value for s in TERMINAL])  # a run not yet ended


class Store:
    def __init__(self, engine: Engine, *, hooks: Hooks | None = None) -> None:
        self.engine = engine
        self.hooks = hooks  # told of every transition, in its transaction and after it commits (hooks/base.py)
        self._after_commit: dict[int, list[Callable[[], None]]] = {}  # open tx() connection → what to run after
        self.dialect = engine.dialect.name
        self._local_locks: set[str] = set()
        self._local_guard = threading.Lock()

    # -- plumbing ---------------------------------------------------------------

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

    # -- runs -------------------------------------------------------------------

    def create_run(
        self,
        conn: Connection,
        *,
        run_id: str,
        agent: str,
        goal_id: str,
        trace_id: str,
        input: dict[str, Any],
        limits: dict[str, Any],
        parent: dict[str, Any] | None = None,
        cause: dict[str, Any] | None = None,
    ) -> bool:
        ts = now()
        return self._insert_ignore(
            conn,
            T.runs,
            dict(run_id=run_id, agent=agent, goal_id=goal_id, trace_id=trace_id, state=RunState.PENDING,
                 version=0, iteration=0, input=input, limits=limits, steps_used=0, input_tokens=0,
                 output_tokens=0, cost_usd=0.0, created_at=ts, updated_at=ts,
                 parent_run_id=parent["run_id"] if parent else None, parent=parent, cause=cause),
            ["run_id"],
        )

    def get_run(self, run_id: str, conn: Connection | None = None, *, lock: bool = False) -> RunRecord | None:
        stmt = select(T.runs).where(T.runs.c.run_id == run_id)
        if lock:
            stmt = stmt.with_for_update()
        if conn is not None:
            row = conn.execute(stmt).first()
        else:
            with self.engine.connect() as own:
                row = own.execute(stmt).first()
        return RunRecord.from_row(row) if row else None

    def transition(self, conn: Connection, run: RunRecord, target: RunState, **fields: Any) -> RunRecord | None:
        """Compare-and-set on (state, version): the run as it now is, or None (logged) when illegal or stale."""
        if not can_transition(run.state, target):
            log.warning("illegal transition ignored", extra={"run_id": run.run_id, "from": run.state, "to": target})
            return None
        changed = dict(state=target, version=run.version + 1, updated_at=now(), **fields)
        stmt = (
            update(T.runs)
            .where(T.runs.c.run_id == run.run_id, T.runs.c.state == run.state, T.runs.c.version == run.version)
            .values(**changed)
        )
        if conn.execute(stmt).rowcount != 1:
            log.info("stale transition ignored", extra={"run_id": run.run_id, "from": run.state, "to": target})
            return None
        moved = dataclasses.replace(run, **changed)
        if self.hooks is not None:
            self._tell(conn, self.hooks, Transition(
                run_id=run.run_id, agent=run.agent, from_state=run.state, to_state=target, at=changed["updated_at"],
                iteration=moved.iteration, error_code=moved.error_code, input_tokens=moved.input_tokens,
                output_tokens=moved.output_tokens, cost_usd=moved.cost_usd))
        return moved

    def _tell(self, conn: Connection, hooks: Hooks, change: Transition) -> None:
        hooks.on_transition(conn, change)
        self.after_commit(conn, lambda: hooks.after_transition(change))

    # -- steps (write-ahead) ------------------------------------------------------

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

    def list_runs(self, *, agent: str | None = None, states: Sequence[str] = (), since: datetime | None = None,
                  limit: int = 50) -> list[RunRecord]:
        """Runs newest first, by agent, state and creation time."""
        stmt = select(T.runs).order_by(T.runs.c.created_at.desc()).limit(limit)
        if agent:
            stmt = stmt.where(T.runs.c.agent == agent)
        if states:
            stmt = stmt.where(T.runs.c.state.in_(list(states)))
        if since is not None:
            stmt = stmt.where(T.runs.c.created_at >= since)
        with self.engine.connect() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(stmt).all()]

    def audit_trail(self, run_id: str) -> list[dict[str, Any]]:
        """A run's state transitions, oldest first (empty when the audit hook is off)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(T.audit).where(T.audit.c.run_id == run_id).order_by(T.audit.c.id)).all()
        return [{**r._mapping, "at": _utc(r.at)} for r in rows]

    # -- transcript ---------------------------------------------------------------

    def append_messages(self, conn: Connection, run_id: str, iteration: int, msgs: Sequence[Message],
                        start: int = 0) -> None:
        for i, message in enumerate(msgs, start=start):
            self._insert_ignore(
                conn, T.messages,
                dict(run_id=run_id, iteration=iteration, position=i, body=message.model_dump(mode="json")),
                ["run_id", "iteration", "position"],
            )

    def transcript(self, run_id: str) -> list[Message]:
        """The run's messages in order. Read as stored text and validated as one JSON array: the
        planner reads the whole transcript every iteration, and a decode plus ``model_validate``
        per row was a third of its CPU (benchmarks/README.md, profile)."""
        with self.engine.connect() as conn:
            bodies = conn.execute(
                select(cast(T.messages.c.body, Text))
                .where(T.messages.c.run_id == run_id)
                .order_by(T.messages.c.iteration, T.messages.c.position)
            ).scalars().all()
        return MESSAGES.validate_json("[" + ",".join(bodies) + "]")

    # -- observer fan-in ------------------------------------------------------------

    def record_observation(self, conn: Connection, *, run_id: str, iteration: int, call_id: str, tool: str,
                           result: dict[str, Any]) -> bool:
        return self._insert_ignore(
            conn, T.observations,
            dict(run_id=run_id, iteration=iteration, call_id=call_id, tool=tool, result=result, received_at=now()),
            ["run_id", "iteration", "call_id"],
        )

    def observations(self, conn: Connection, run_id: str, iteration: int) -> list[dict[str, Any]]:
        rows = conn.execute(
            select(T.observations)
            .where(T.observations.c.run_id == run_id, T.observations.c.iteration == iteration)
        ).all()
        return [dict(r._mapping) for r in rows]

    # -- dedupe and outbox -------------------------------------------------------------

    def processed_outbox(self, event_id: str, consumer: str) -> list[dict[str, Any]] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(T.processed_events.c.outbox).where(
                    T.processed_events.c.event_id == event_id, T.processed_events.c.consumer == consumer
                )
            ).first()
        return None if row is None else list(row.outbox)

    def mark_processed(self, conn: Connection, event_id: str, consumer: str, outbox: list[dict[str, Any]],
                       run_id: str | None = None) -> bool:
        return self._insert_ignore(
            conn, T.processed_events,
            dict(event_id=event_id, consumer=consumer, outbox=outbox, processed_at=now(), run_id=run_id),
            ["event_id", "consumer"],
        )

    # -- tool health ----------------------------------------------------------------------

    def record_health_change(self, conn: Connection, *, event_id: str, tool: str, kind: str, status: str,
                             detail: str | None, by: str, occurred_at: datetime) -> None:
        self._insert_ignore(conn, T.tool_health_events,
                            dict(event_id=event_id, tool=tool, kind=kind, status=status,
                                 detail=(detail or "")[:1000] or None, by=by[:255], occurred_at=occurred_at),
                            ["event_id"])

    def health_changes(self, tool: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """The latest changes, newest first."""
        query = select(T.tool_health_events).order_by(T.tool_health_events.c.occurred_at.desc()).limit(limit)
        if tool is not None:
            query = query.where(T.tool_health_events.c.tool == tool)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [{**row, "occurred_at": _utc(row["occurred_at"])} for row in rows]

    # -- the sweeper's view -------------------------------------------------------------

    def quiet_runs(self, before: datetime, limit: int, after: tuple[datetime, str] | None = None
                   ) -> list[RunRecord]:
        """Runs whose row has not changed (nor been re-driven) since ``before``: live ones, and ended
        ones with a Result still owed to a reply_to. Oldest first, a page at a time (``after`` the
        last one seen), so runs that are only waiting never hide stalled ones behind them."""
        owed = select(T.run_replies.c.run_id).where(T.run_replies.c.delivered_at.is_(None))
        stmt = (
            select(T.runs)
            .where(T.runs.c.updated_at < before,
                   (T.runs.c.redriven_at.is_(None)) | (T.runs.c.redriven_at < before),
                   LIVE | T.runs.c.run_id.in_(owed))
            .order_by(T.runs.c.updated_at, T.runs.c.run_id)
            .limit(limit)
        )
        if after is not None:
            stmt = stmt.where((T.runs.c.updated_at > after[0])
                              | ((T.runs.c.updated_at == after[0]) & (T.runs.c.run_id > after[1])))
        with self.engine.connect() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(stmt).all()]

    def last_activity(self, run: RunRecord) -> datetime:
        """The latest sign of life of a run: its row, a step starting or finishing, a tool result arriving."""
        with self.engine.connect() as conn:
            times = conn.execute(
                select(func.max(T.steps.c.started_at), func.max(T.steps.c.finished_at))
                .where(T.steps.c.run_id == run.run_id)
            ).one()
            received = conn.execute(
                select(func.max(T.observations.c.received_at)).where(T.observations.c.run_id == run.run_id)
            ).scalar()
        candidates = [run.updated_at, run.redriven_at, *times, received]
        return max(t for t in map(_utc, candidates) if t is not None)

    def stored_events(self, run_id: str) -> list[dict[str, Any]]:
        """Every event the run's handled steps produced (their stored outboxes), oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(T.processed_events.c.outbox).where(T.processed_events.c.run_id == run_id)
                .order_by(T.processed_events.c.processed_at)
            ).scalars().all()
        return [event for outbox in rows for event in outbox]

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

    def note_redrive(self, conn: Connection, run_id: str) -> None:
        conn.execute(update(T.runs).where(T.runs.c.run_id == run_id)
                     .values(redrives=T.runs.c.redrives + 1, redriven_at=now()))

    # -- reply targets ------------------------------------------------------------------

    def add_reply(self, conn: Connection, run_id: str, reply_to: str, correlation_id: str | None) -> None:
        self._insert_ignore(
            conn, T.run_replies,
            dict(run_id=run_id, reply_to=reply_to, correlation_id=correlation_id or ""),
            ["run_id", "reply_to", "correlation_id"],
        )

    def pending_replies(self, run_id: str) -> list[tuple[int, str, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(T.run_replies.c.id, T.run_replies.c.reply_to, T.run_replies.c.correlation_id)
                .where(T.run_replies.c.run_id == run_id, T.run_replies.c.delivered_at.is_(None))
                .order_by(T.run_replies.c.id)
            ).all()
        return [(r.id, r.reply_to, r.correlation_id) for r in rows]

    def mark_replied(self, conn: Connection, ids: Sequence[int]) -> None:
        if ids:
            conn.execute(update(T.run_replies).where(T.run_replies.c.id.in_(list(ids))).values(delivered_at=now()))

    # -- approvals ------------------------------------------------------------------------

    def request_approval(self, conn: Connection, **values: Any) -> bool:
        """Park a call (once: a second copy of its tool.requested finds the request there)."""
        return self._insert_ignore(conn, T.approvals, {**values, "status": APPROVAL_PENDING, "requested_at": now()},
                                   ["approval_id"])

    def approval(self, approval_id: str, conn: Connection | None = None, *, lock: bool = False
                 ) -> ApprovalRecord | None:
        stmt = select(T.approvals).where(T.approvals.c.approval_id == approval_id)
        return self._one_approval(stmt.with_for_update() if lock else stmt, conn)

    def approval_for_call(self, conn: Connection, run_id: str, call_id: str) -> ApprovalRecord | None:
        """The newest request for a call id of a run (models reuse call ids across iterations), locked."""
        stmt = (select(T.approvals).where(T.approvals.c.run_id == run_id, T.approvals.c.call_id == call_id)
                .order_by(T.approvals.c.iteration.desc()).limit(1).with_for_update())
        return self._one_approval(stmt, conn)

    def _one_approval(self, stmt: Any, conn: Connection | None) -> ApprovalRecord | None:
        if conn is not None:
            row = conn.execute(stmt).first()
        else:
            with self.engine.connect() as own:
                row = own.execute(stmt).first()
        return ApprovalRecord.from_row(row) if row else None

    def resolve_approval(self, conn: Connection, approval_id: str, *, status: str, by: str, note: str | None,
                         edited_arguments: dict[str, Any] | None, at: datetime | None = None) -> bool:
        """Answer a pending request (compare-and-set: the first answer wins)."""
        return conn.execute(
            update(T.approvals)
            .where(T.approvals.c.approval_id == approval_id, T.approvals.c.status == APPROVAL_PENDING)
            .values(status=status, resolved_by=by[:255], note=(note or "")[:2000] or None,
                    edited_arguments=edited_arguments, resolved_at=at or now())
        ).rowcount == 1

    def mark_sent(self, approval_id: str, at: datetime) -> None:
        """approval.resolved was confirmed published at ``at`` (the timer leaves it alone for a stall time)."""
        with self.tx() as conn:
            conn.execute(update(T.approvals).where(T.approvals.c.approval_id == approval_id).values(sent_at=at))

    def mark_applied(self, conn: Connection, approval_id: str) -> None:
        conn.execute(update(T.approvals).where(T.approvals.c.approval_id == approval_id).values(applied_at=now()))

    def parked_calls(self, conn: Connection, run_id: str, iteration: int) -> set[str]:
        """Call ids of the iteration that wait for an answer."""
        return set(conn.execute(
            select(T.approvals.c.call_id).where(T.approvals.c.run_id == run_id, T.approvals.c.iteration == iteration,
                                                T.approvals.c.status == APPROVAL_PENDING)
        ).scalars().all())

    def pending_approvals(self, *, run_id: str | None = None, limit: int = 1000) -> list[ApprovalRecord]:
        """Requests waiting for an answer on runs still live, oldest first."""
        return self._approvals(T.approvals.c.status == APPROVAL_PENDING,
                               *([T.approvals.c.run_id == run_id] if run_id else []), limit=limit)

    def expired_approvals(self, at: datetime, limit: int = 200) -> list[ApprovalRecord]:
        return self._approvals(T.approvals.c.status == APPROVAL_PENDING, T.approvals.c.expires_at <= at,
                               limit=limit)

    def _approvals(self, *where: Any, limit: int) -> list[ApprovalRecord]:
        stmt = (select(T.approvals).join(T.runs, T.runs.c.run_id == T.approvals.c.run_id)
                .where(LIVE, *where).order_by(T.approvals.c.requested_at).limit(limit))
        with self.engine.connect() as conn:
            return [ApprovalRecord.from_row(r) for r in conn.execute(stmt).all()]

    def unapplied_approvals(self, unsent_before: datetime, sent_before: datetime, limit: int = 200
                            ) -> list[tuple[ApprovalRecord, str]]:
        """Answers the observer has not acted on, with their run's trace id: those answered before
        ``unsent_before`` whose approval.resolved was never confirmed sent (the answerer died or lost the
        broker, or had none), and those sent before ``sent_before`` (lost since: no queue is that slow)."""
        unsent = ((T.approvals.c.sent_at.is_(None) & (T.approvals.c.resolved_at <= unsent_before))
                  | (T.approvals.c.sent_at <= sent_before))
        stmt = (select(T.approvals, T.runs.c.trace_id).join(T.runs, T.runs.c.run_id == T.approvals.c.run_id)
                .where(T.approvals.c.status != APPROVAL_PENDING, T.approvals.c.applied_at.is_(None), unsent,
                       LIVE)  # an ended run has nothing to apply an answer to
                .order_by(T.approvals.c.resolved_at).limit(limit))
        with self.engine.connect() as conn:
            return [(ApprovalRecord.from_row(r), r.trace_id) for r in conn.execute(stmt).all()]

    def approvals_of(self, run_id: str) -> list[ApprovalRecord]:
        """A run's requests and answers, in the order they were asked."""
        stmt = select(T.approvals).where(T.approvals.c.run_id == run_id).order_by(T.approvals.c.requested_at)
        with self.engine.connect() as conn:
            return [ApprovalRecord.from_row(r) for r in conn.execute(stmt).all()]

    # ------------------------------------------------------------------ artifacts

    def keep_artifacts(self, conn: Connection, *, run_id: str, call_id: str, tool: str,
                       refs: Sequence[dict[str, Any]], payloads: dict[str, Payload]) -> None:
        """Store each artifact's content once (by reference) and link it to the call that produced it.

        Content in bytes is one row; content in a file (a kept work directory) is streamed in
        ``ARTIFACT_CHUNK`` bytes a row, so no worker holds it whole. A reference without content here
        (a cached result served again) is linked only: its content was stored when it was first
        produced, and references are content addresses."""
        at = now()
        for ref in refs:
            content = payloads.get(ref["ref"])
            size = ref.get("size", 0)
            if isinstance(content, bytes | bytearray):
                size = len(content)
                self._insert_ignore(conn, T.artifacts, {
                    "ref": ref["ref"], "size": size, "media_type": ref.get("media_type", "application/json"),
                    "content": bytes(content), "created_at": at}, ["ref"])
            elif content is not None and self._insert_ignore(conn, T.artifacts, {
                    "ref": ref["ref"], "size": size, "media_type": ref.get("media_type", "application/octet-stream"),
                    "content": None, "created_at": at}, ["ref"]):
                content.seek(0)
                for seq, chunk in enumerate(iter(lambda f=content: f.read(ARTIFACT_CHUNK), b"")):
                    conn.execute(T.artifact_chunks.insert().values(ref=ref["ref"], seq=seq, data=chunk))
            self._insert_ignore(conn, T.run_artifacts, {
                "run_id": run_id, "ref": ref["ref"], "call_id": call_id, "tool": tool,
                "kind": ref.get("kind", "output"), "size": size, "created_at": at,
            }, ["run_id", "ref", "call_id"])

    def artifact_part(self, run_id: str, ref: str, offset: int, length: int) -> tuple[bytes, int] | None:
        """``length`` bytes of an artifact from ``offset``, and its whole size, if one of this run's calls
        produced it (runs do not read each other's). Reads only the chunks that part lies in."""
        a = T.artifacts.c
        stmt = (select(a.size, a.content).join(T.run_artifacts, T.run_artifacts.c.ref == a.ref)
                .where(T.run_artifacts.c.run_id == run_id, a.ref == ref).limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(stmt).first()
            if row is None:
                return None
            size, content = int(row[0]), row[1]
            if content is not None:
                return bytes(content[offset: offset + length]), len(content)
            first, last = offset // ARTIFACT_CHUNK, max(offset, offset + length - 1) // ARTIFACT_CHUNK
            c = T.artifact_chunks.c
            chunks = conn.execute(select(c.data).where(c.ref == ref, c.seq.between(first, last))
                                  .order_by(c.seq)).scalars().all()
        joined = b"".join(bytes(ch) for ch in chunks)
        start = offset - first * ARTIFACT_CHUNK
        return joined[start: start + length], size

    def artifact_of_run(self, run_id: str, ref: str) -> bytes | None:
        """An artifact's whole content, if one of this run's calls produced it (small ones; ``copy_artifact``
        streams large ones)."""
        found = self.artifact_part(run_id, ref, 0, 1 << 62)
        return found[0] if found is not None else None

    def copy_artifact(self, run_id: str, ref: str, out: BinaryIO) -> bool:
        """Write an artifact of this run to ``out`` a chunk at a time; False when the run has no such artifact."""
        offset = 0
        while True:
            found = self.artifact_part(run_id, ref, offset, ARTIFACT_CHUNK)
            if found is None:
                return False
            part, size = found
            out.write(part)
            offset += len(part)
            if not part or offset >= size:
                return True

    def artifacts_of(self, run_id: str) -> list[dict[str, Any]]:
        """A run's artifacts, in the order its calls produced them: reference, kind, size, tool, call."""
        r = T.run_artifacts.c
        stmt = (select(r.ref, r.kind, r.size, r.tool, r.call_id, r.created_at, T.artifacts.c.media_type)
                .join(T.artifacts, T.artifacts.c.ref == r.ref)
                .where(r.run_id == run_id).order_by(r.created_at, r.call_id))
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(stmt).all()]

    # ------------------------------------------------------------------ run trees (delegation)

    def children(self, run_id: str, conn: Connection | None = None) -> list[RunRecord]:
        """Runs started by this run's delegations, oldest first."""
        stmt = select(T.runs).where(T.runs.c.parent_run_id == run_id).order_by(T.runs.c.created_at, T.runs.c.run_id)
        if conn is not None:
            return [RunRecord.from_row(r) for r in conn.execute(stmt).all()]
        with self.engine.connect() as own:
            return [RunRecord.from_row(r) for r in own.execute(stmt).all()]

    def count_runs_in_trace(self, trace_id: str, conn: Connection) -> int:
        return int(conn.execute(select(func.count()).select_from(T.runs).where(T.runs.c.trace_id == trace_id))
                   .scalar_one())

    def runs_in_trace(self, trace_id: str, limit: int = 1000, conn: Connection | None = None) -> list[RunRecord]:
        """Every run sharing a trace id (a goal, the runs it delegated to and those its events triggered); in the
        caller's transaction when given one."""
        stmt = (select(T.runs).where(T.runs.c.trace_id == trace_id)
                .order_by(T.runs.c.created_at, T.runs.c.run_id).limit(limit))
        if conn is not None:
            return [RunRecord.from_row(r) for r in conn.execute(stmt).all()]
        with self.engine.connect() as own:
            return [RunRecord.from_row(r) for r in own.execute(stmt).all()]

    def add_spend(self, conn: Connection, run_ids: list[str], usage: Usage | None,
                  release: Reservation | None = None) -> None:
        """Count a delegated run's model turn (``usage``; None: the turn was not taken) in each of its ancestors'
        spend, and give back what the turn had reserved there, in the transaction that records the turn (once,
        however often the step is retried): one budget per tree, live. No state change."""
        r = T.runs.c
        values: dict[str, Any] = {}
        if usage is not None:
            values = dict(steps_used=r.steps_used + 1, input_tokens=r.input_tokens + usage.input_tokens,
                          output_tokens=r.output_tokens + usage.output_tokens, cost_usd=r.cost_usd + usage.cost_usd,
                          cached_input_tokens=r.cached_input_tokens + usage.cached_input_tokens)
            if usage.unpriced:
                values["unpriced"] = True
        if release is not None:
            values.update(reserved_tokens=r.reserved_tokens - release.tokens,
                          reserved_cost_usd=r.reserved_cost_usd - release.cost_usd,
                          reserved_steps=r.reserved_steps - release.steps)
        if values:
            conn.execute(update(T.runs).where(r.run_id.in_(run_ids)).values(**values))

    def reserve(self, conn: Connection, run_ids: list[str], reservation: Reservation) -> None:
        """Hold a turn's estimate in each ancestor until the turn records what it spent (``add_spend``)."""
        r = T.runs.c
        conn.execute(update(T.runs).where(r.run_id.in_(run_ids)).values(
            reserved_tokens=r.reserved_tokens + reservation.tokens,
            reserved_cost_usd=r.reserved_cost_usd + reservation.cost_usd,
            reserved_steps=r.reserved_steps + reservation.steps))

    def set_step_input(self, conn: Connection, key: str, value: Any) -> None:
        conn.execute(update(T.steps).where(T.steps.c.idempotency_key == key).values(input=value))

    def step_input(self, conn: Connection, key: str, *, lock: bool = False) -> Any:
        stmt = select(T.steps.c.input).where(T.steps.c.idempotency_key == key)
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).scalar()

    def get_runs(self, run_ids: list[str], conn: Connection | None = None, *, lock: bool = False
                 ) -> list[RunRecord]:
        """Several runs in one query, in the order asked (those not found left out); ``lock``: held until the
        caller's transaction ends, taken in id order (one order for every caller: no deadlock)."""
        stmt = select(T.runs).where(T.runs.c.run_id.in_(run_ids)).order_by(T.runs.c.run_id)
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        if conn is None:
            with self.engine.connect() as own:
                rows = own.execute(stmt).all()
        else:
            rows = conn.execute(stmt).all()
        found = {r.run_id: r for r in map(RunRecord.from_row, rows)}
        return [found[i] for i in run_ids if i in found]

    def delegated_calls(self, conn: Connection, run_id: str, iteration: int) -> set[str]:
        """Calls of an iteration handed to child runs, whose answers have not all come back."""
        s = T.steps.c
        stmt = select(s.call_id).where(s.run_id == run_id, s.iteration == iteration, s.kind == "tool",
                                       s.status == "delegated")
        return {row[0] for row in conn.execute(stmt).all()}

    # ------------------------------------------------------------------ domain events

    def record_domain_event(self, conn: Connection, *, event_id: str, name: str, payload: dict[str, Any],
                            source: str, run_id: str | None, step_key: str | None, trace_id: str) -> bool:
        """Keep a domain event once; True when this call recorded it (the first delivery)."""
        return self._insert_ignore(conn, T.domain_events, {
            "event_id": event_id, "name": name, "payload": payload, "source": source, "run_id": run_id,
            "step_key": step_key, "trace_id": trace_id, "recorded_at": now()}, ["event_id"])

    def domain_event(self, event_id: str, conn: Connection | None = None) -> dict[str, Any] | None:
        """One recorded domain event (in the caller's transaction when given one)."""
        stmt = select(T.domain_events).where(T.domain_events.c.event_id == event_id)
        if conn is not None:
            row = conn.execute(stmt).first()
        else:
            with self.engine.connect() as own:
                row = own.execute(stmt).first()
        return dict(row._mapping) if row is not None else None

    def domain_events(self, *, name: str | None = None, run_id: str | None = None, event_id: str | None = None,
                      limit: int = 200) -> list[dict[str, Any]]:
        d = T.domain_events.c
        stmt = select(T.domain_events).order_by(d.recorded_at).limit(limit)
        if event_id is not None:
            stmt = stmt.where(d.event_id == event_id)
        if name is not None:
            stmt = stmt.where(d.name == name)
        if run_id is not None:
            stmt = stmt.where(d.run_id == run_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt).all()]

    def fleet_secret(self, name: str) -> str:
        """A secret every process of this fleet shares: made once (by whichever process asks first), then read.

        Read on a connection of its own, never pooled: the first process to need it may be a prefork worker's
        parent (its health timer seals what it writes), and a pooled connection would pass to its children."""
        import secrets

        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        own = self.engine if self.dialect == "sqlite" else create_engine(self.engine.url, poolclass=NullPool)
        try:
            with own.begin() as conn:
                self._insert_ignore(conn, T.fleet_secrets, {"name": name, "value": secrets.token_hex(32),
                                                            "created_at": now()}, ["name"])
                stmt = select(T.fleet_secrets.c.value).where(T.fleet_secrets.c.name == name)
                return str(conn.execute(stmt).scalar_one())
        finally:
            if own is not self.engine:
                own.dispose()
