"""Runs: creating one, reading one or a tree of them, and moving one from state to state (with its audit row)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Connection, DateTime, Select, func, select, tuple_

from agentfleet.hooks.base import Transition, current_step
from agentfleet.loop.states import RunState, can_transition
from agentfleet.store import tables as T
from agentfleet.store.base import StepHold, StoreBase, lock_id
from agentfleet.store.records import RunRecord, as_utc, now
from agentfleet.store.sql import POSTGRES, Later, Sql, defer, execute, kinds_of, undefer

log = logging.getLogger(__name__)

RUN_COLUMNS = tuple(c.name for c in T.runs.columns)
_RUN_KINDS = kinds_of(T.runs, RUN_COLUMNS)
_RUN_JSON = frozenset(c.name for c in T.runs.columns if isinstance(c.type, JSON))
_RUN_TIMES = frozenset(c.name for c in T.runs.columns if isinstance(c.type, DateTime))
GET_RUN = Sql(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE run_id = :run_id", result=_RUN_KINDS)
CREATE_RUN = Sql(f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join(':' + c for c in RUN_COLUMNS)}) "
                 f"ON CONFLICT (run_id) DO NOTHING RETURNING {', '.join(RUN_COLUMNS)}",
                 json=_RUN_JSON, times=_RUN_TIMES, result=_RUN_KINDS)
GET_RUN_LOCKED = Sql(GET_RUN.text + "{for_update}", result=_RUN_KINDS)
AUDIT_COLUMNS = ("at", "run_id", "agent", "from_state", "to_state", "iteration", "event_id", "event_type", "reason",
                 "step_duration_ms", "input_tokens", "output_tokens", "cost_usd", "worker")
AUDIT = Sql(f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join(':' + c for c in AUDIT_COLUMNS)})",
            times=frozenset({"at"}))
# What is written to a run's row without a version bump: a tree's spend and reservations (spend.py), a thread's place
# (threads.py), the sweeper's re-drives (sweeping.py). Every other change is a move, which bumps it.
UNVERSIONED = ("steps_used", "input_tokens", "output_tokens", "cost_usd", "cached_input_tokens", "unpriced",
               "reserved_tokens", "reserved_cost_usd", "reserved_steps", "thread_seq", "redrives", "redriven_at")
# The run's row locked if it is as read (its version and the rest), else the transaction fails (migration 0020). Its
# state and iteration, which the version stands for, are checked too: a run known from an event (``RunLeft``) is
# known on them from the event, which the version alone would not catch were the event wrong.
HOLD_AS_READ = Sql(
    "WITH held AS (SELECT 1 FROM runs WHERE run_id = :run_id AND version = :version AND state = :state "
    "AND iteration = :iteration AND "
    + " AND ".join(f"{c} IS NOT DISTINCT FROM :{c}" for c in UNVERSIONED)
    + " FOR UPDATE) SELECT agentfleet_moved_on(:run_id) WHERE NOT EXISTS (SELECT 1 FROM held)",
    times=frozenset({"redriven_at"}), rows=False)
# The run's row locked if it is as this handling takes it to be, without having read it (its state checked too: a row
# known from an event is not known on everything a move changes unless the move is known), and the step's lock taken,
# in one statement; else the transaction fails (AF001), with nothing written and no lock taken: CASE asks for the lock
# only once the row is held, and fails the statement when the lock is not had (a session's advisory lock outlives a
# rollback: taken by a statement that then failed, it would be left held with nobody knowing).
HOLD_AND_LOCK = Sql(
    "WITH held AS MATERIALIZED (SELECT 1 FROM runs WHERE run_id = :run_id AND version = :version "
    "AND state = :state AND " + " AND ".join(f"{c} IS NOT DISTINCT FROM :{c}" for c in UNVERSIONED)
    + " FOR UPDATE) SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM held) THEN agentfleet_moved_on(:run_id) IS NULL "
    "WHEN pg_try_advisory_lock(:k) THEN true ELSE agentfleet_moved_on(:run_id) IS NULL END",
    times=frozenset({"redriven_at"}), rows=True)
# A new run's row: the table's own column defaults (tables.py), the rest given by create_run.
_NEW_RUN = {c.name: c.default.arg if c.default is not None and not callable(c.default.arg) else None
            for c in T.runs.columns}
_transitions: dict[tuple[str, ...], Sql] = {}
_audited: dict[tuple[str, ...], Sql] = {}


def _transition_sql(fields: tuple[str, ...]) -> Sql:
    """The compare-and-set UPDATE setting ``fields`` (besides state, version, updated_at): one per field set."""
    stmt = _transitions.get(fields)
    if stmt is None:
        sets = ", ".join(f"{f} = :{f}" for f in ("state", "version", "updated_at", *fields))
        stmt = _transitions[fields] = Sql(
            f"UPDATE runs SET {sets} WHERE run_id = :run_id AND state = :from_state AND version = :from_version",
            json=_RUN_JSON & {*fields}, times=_RUN_TIMES & {"updated_at", *fields})
    return stmt


def _audited_transition_sql(fields: tuple[str, ...]) -> Sql:
    """Postgres: the same UPDATE with its audit row, in one statement (the row is written only if the run moved;
    its count is the moved count). One round trip a transition instead of two, three times an iteration."""
    stmt = _audited.get(fields)
    if stmt is None:
        update = _transition_sql(fields)
        values = ", ".join(f":a_{c}" for c in AUDIT_COLUMNS)
        stmt = _audited[fields] = Sql(
            f"WITH moved AS ({update.text} RETURNING 1) "
            f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) SELECT {values} FROM moved",
            json=update.json, times=update.times | {"a_at"}, rows=False)
    return stmt


@dataclass(frozen=True)
class _Move:
    """A held run's move, deferred and not sent yet: the version it leaves the run at, its statement, where it began
    (state, version), what it sets besides state, version and time, and its audit row (None: not audited)."""

    version: int
    later: Later
    start: tuple[str, int]
    fields: dict[str, Any]
    audit: dict[str, Any] | None


def run_from(row: tuple[object, ...]) -> RunRecord:
    return RunRecord.from_mapping(dict(zip(RUN_COLUMNS, row, strict=True)))


class Runs(StoreBase):
    """Creating, reading and moving runs."""

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
        progress: bool = False,
        thread_id: str | None = None,
        lineage: dict[str, Any] | None = None,
    ) -> bool:
        """Create the run unless it exists; True when this call created it."""
        return self._create_run(conn, run_id=run_id, agent=agent, goal_id=goal_id, trace_id=trace_id, input=input,
                                limits=limits, parent=parent, cause=cause, progress=progress,
                                thread_id=thread_id, lineage=lineage) is not None

    def start_run(self, conn: Connection, **fields: Any) -> RunRecord:
        """The run ``create_run``'s fields describe, held (row-locked) in ``conn``'s transaction: the one this call
        created (as written: not read back), or the one already there."""
        created = self._create_run(conn, **fields)
        if created is not None:
            return created
        run = self.get_run(fields["run_id"], conn, lock=True)
        assert run is not None, "a run that conflicted is there"
        return run

    def _create_run(self, conn: Connection, *, run_id: str, agent: str, goal_id: str, trace_id: str,
                    input: dict[str, Any], limits: dict[str, Any], parent: dict[str, Any] | None = None,
                    cause: dict[str, Any] | None = None, progress: bool = False,
                    thread_id: str | None = None, lineage: dict[str, Any] | None = None) -> RunRecord | None:
        ts = now()
        values = {**_NEW_RUN, "run_id": run_id, "agent": agent, "goal_id": goal_id, "trace_id": trace_id,
                  "state": str(RunState.PENDING), "input": input, "limits": limits, "created_at": ts,
                  "updated_at": ts, "parent_run_id": parent["run_id"] if parent else None, "parent": parent,
                  "cause": cause, "progress": progress, "thread_id": thread_id, "lineage": lineage,
                  "lineage_run_id": lineage["run_id"] if lineage else None,
                  "iteration": int(lineage["through"]) + 1 if lineage else 0}
        row = execute(conn, CREATE_RUN, values).first()
        if row is None:
            return None
        run = run_from(row)
        self._hold(conn, run.run_id, run.version)  # not visible to anyone else before this transaction commits
        return run

    def get_run(self, run_id: str, conn: Connection | None = None, *, lock: bool = False) -> RunRecord | None:
        stmt = GET_RUN_LOCKED if lock else GET_RUN
        if conn is not None:
            row = execute(conn, stmt, {"run_id": run_id}).first()
        else:
            with self.reading() as own:
                row = execute(own, stmt, {"run_id": run_id}).first()
        run = run_from(row) if row else None
        if run is not None and lock and conn is not None:
            self._hold(conn, run.run_id, run.version)
        return run

    def hold_run(self, conn: Connection, run: RunRecord) -> RunRecord | None:
        """The run as this handling read it in an earlier transaction (``run``), held in ``conn``'s: on Postgres
        without reading it again. The check goes with the transaction's next round trip (its COMMIT, as a rule): it
        locks the row if the row is as read, and else fails the transaction, with ``RunMovedOn`` from ``tx``, so that
        none of its writes stays; the caller then reads the run again. As read means at the same version (a move
        bumps it), state and iteration, and with the same values of what is written without one (``UNVERSIONED``). A
        move of it is sent with the check (the row is held at ``run``'s version). Elsewhere (SQLite: a read costs no
        round trip) the run read again, held; None if it is gone."""
        if self.dialect != POSTGRES:
            return self.get_run(run.run_id, conn, lock=True)
        defer(conn, HOLD_AS_READ, {"run_id": run.run_id, "version": run.version, "state": str(run.state),
                                   "iteration": run.iteration, **{c: getattr(run, c) for c in UNVERSIONED}})
        self._hold(conn, run.run_id, run.version)
        return run

    def hold_and_lock(self, conn: Connection, run: RunRecord, hold: StepHold | bool) -> bool:
        """``hold_run`` for a run this handling takes to be as ``run`` says without having read it (as its own last
        commit left it, moved on as an event says), with the step's lock (``step_lock``, not asked for yet) asked in
        the same statement: nothing goes to the database before the transaction's COMMIT, or its next read. The
        transaction fails with ``RunMovedOn`` when the row is not as ``run`` says (its state included) or the step
        is held elsewhere; nothing it wrote stays, nothing was taken, and ``hold.ask_again()`` then lets the caller
        ask for the lock and the row the usual way, which tells the two apart. False, with nothing sent, when this
        cannot be done (not Postgres, or the lock was asked for already): the caller reads the run."""
        if self.dialect != POSTGRES or not isinstance(hold, StepHold):
            return False
        later = hold.ask_with(conn, HOLD_AND_LOCK, {"run_id": run.run_id, "version": run.version,
                                                    "state": str(run.state), "k": lock_id(hold.key),
                                                    **{c: getattr(run, c) for c in UNVERSIONED}})
        if later is None:
            return False
        self._hold(conn, run.run_id, run.version)
        return True

    def get_runs(self, run_ids: list[str], conn: Connection | None = None, *, lock: bool = False
                 ) -> list[RunRecord]:
        """Several runs in one query, in the order asked (those not found left out); ``lock``: held until the
        caller's transaction ends, taken in id order (one order for every caller: no deadlock)."""
        stmt = select(T.runs).where(T.runs.c.run_id.in_(run_ids)).order_by(T.runs.c.run_id)
        if lock and self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        if conn is None:
            with self.reading() as own:
                rows = own.execute(stmt).all()
        else:
            rows = conn.execute(stmt).all()
        found = {r.run_id: r for r in map(RunRecord.from_row, rows)}
        return [found[i] for i in run_ids if i in found]

    def transition(self, conn: Connection, run: RunRecord, target: RunState, **fields: Any) -> RunRecord | None:
        """Compare-and-set on (state, version): the run as it now is, or None (logged) when illegal or stale."""
        if not can_transition(run.state, target):
            log.warning("illegal transition ignored", extra={"run_id": run.run_id, "from": run.state, "to": target})
            return None
        changed = dict(state=target, version=run.version + 1, updated_at=now(), **fields)
        moved = run.replace(**changed)
        change = self._transition(run, moved) if self.hooks is not None or self.audit else None
        audited = self.audit and self.dialect == POSTGRES
        held = self._held_runs(conn)
        if held is not None and held.get(run.run_id) == run.version and self.dialect == POSTGRES:
            self._defer_move(conn, run, moved, fields, change if audited else None)
        else:
            params = {**changed, "state": str(target), "run_id": run.run_id, "from_state": str(run.state),
                      "from_version": run.version}
            if audited:
                assert change is not None
                params.update({f"a_{k}": v for k, v in change.record().items()})
            stmt = (_audited_transition_sql if audited else _transition_sql)(tuple(fields))
            if execute(conn, stmt, params).rowcount != 1:
                log.info("stale transition ignored", extra={"run_id": run.run_id, "from": run.state, "to": target})
                return None
        self._hold(conn, run.run_id, moved.version)  # an UPDATE holds the row it changed
        if change is not None:
            self._record(conn, change, audited=audited)
        return moved

    def _defer_move(self, conn: Connection, run: RunRecord, moved: RunRecord, fields: dict[str, Any],
                    change: Transition | None) -> None:
        """Send the move of a run held at its version with the transaction's next round trip: the compare-and-set
        cannot miss. When the transaction's last move of the run is still unsent, and nothing deferred since names
        the runs table, the two go as one UPDATE, from where the first began to where this one ends (the version
        counts both), the first's audit row written on its own before it: one row version and one set of index
        entries instead of two (a move was the dearest statement of an iteration: ~100 µs and 1.8 KB of WAL,
        benchmarks/README.md, issue 23). Nothing else can see the row between the two: it is held."""
        moves = self._moves(conn)
        earlier: _Move | None = moves.pop(run.run_id, None)
        start = (str(run.state), run.version)
        if earlier is not None and earlier.version == run.version and undefer(conn, earlier.later,
                                                                                unless_after="runs"):
            start, fields = earlier.start, {**earlier.fields, **fields}
            if earlier.audit is not None:
                defer(conn, AUDIT, earlier.audit)
        audit = change.record() if change is not None else None
        params = {**fields, "state": str(moved.state), "version": moved.version, "updated_at": moved.updated_at,
                  "run_id": run.run_id, "from_state": start[0], "from_version": start[1]}
        if audit is not None:
            params.update({f"a_{k}": v for k, v in audit.items()})
        stmt = (_audited_transition_sql if audit is not None else _transition_sql)(tuple(fields))
        moves[run.run_id] = _Move(moved.version, defer(conn, stmt, params, keep=True), start, fields, audit)

    def _hold(self, conn: Connection, run_id: str, version: int) -> None:
        """``conn``'s open transaction holds the run's row at ``version`` (a lock, until it ends)."""
        held = self._held_runs(conn)
        if held is not None:
            held[run_id] = version

    def _transition(self, run: RunRecord, moved: RunRecord) -> Transition:
        step = current_step()
        return Transition(
            run_id=run.run_id, agent=run.agent, from_state=run.state, to_state=moved.state, at=moved.updated_at,
            iteration=moved.iteration, error_code=moved.error_code, input_tokens=moved.input_tokens,
            output_tokens=moved.output_tokens, cost_usd=moved.cost_usd,
            worker=step.worker if step else self.process, event_id=step.event_id if step else None,
            event_type=step.event_type if step else None,
            step_duration_ms=round((time.perf_counter() - step.started) * 1000, 3) if step else None)

    def _record(self, conn: Connection, change: Transition, *, audited: bool = False) -> None:
        """The audit row (unless the move's own statement wrote it) and the hooks' look at the move, in its
        transaction; the hooks again once it committed."""
        if self.audit and not audited:
            defer(conn, AUDIT, change.record())
        hooks = self.hooks
        if hooks is not None:
            hooks.on_transition(change)
            self.after_commit(conn, lambda: hooks.after_transition(change))

    def list_runs(self, *, agent: str | None = None, states: Sequence[str] = (), since: datetime | None = None,
                  until: datetime | None = None, goal_id: str | None = None,
                  before: tuple[datetime, str] | None = None, limit: int = 50) -> list[RunRecord]:
        """Runs newest first (``created_at, run_id`` descending), by agent, state, creation time or goal id.
        ``before``: the page after the run with this ``(created_at, run_id)`` (a keyset, not an offset: a page
        costs the same however deep it is, read from an index in order — migration 0019)."""
        stmt = self.runs_query(agent=agent, states=states, since=since, until=until, goal_id=goal_id, before=before,
                               limit=limit)
        with self.reading() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(stmt).all()]

    @staticmethod
    def runs_query(*, agent: str | None = None, states: Sequence[str] = (), since: datetime | None = None,
                   until: datetime | None = None, goal_id: str | None = None,
                   before: tuple[datetime, str] | None = None, limit: int = 50) -> Select[Any]:
        """The statement ``list_runs`` runs (tests read its plan: an index in order, never a sort of the table)."""
        c = T.runs.c
        stmt = select(T.runs).order_by(c.created_at.desc(), c.run_id.desc()).limit(limit)
        if agent:
            stmt = stmt.where(c.agent == agent)
        if states:
            stmt = stmt.where(c.state.in_(list(states)))
        if since is not None:
            stmt = stmt.where(c.created_at >= since)
        if until is not None:
            stmt = stmt.where(c.created_at < until)
        if goal_id:
            stmt = stmt.where(c.goal_id == goal_id)
        if before is not None:  # a row comparison: an index range, where an OR of two conditions is a filter
            stmt = stmt.where(tuple_(c.created_at, c.run_id) < tuple_(*before))
        return stmt

    def newest_versions(self, limit: int) -> tuple[tuple[str, int], ...]:
        """(run id, version) of the newest ``limit`` runs: it changes when a run is created or one of them moves (every
        move bumps the version), read from the creation index without the rows' JSON."""
        stmt = self.runs_query(limit=limit).with_only_columns(T.runs.c.run_id, T.runs.c.version)
        with self.reading() as conn:
            return tuple((r.run_id, r.version) for r in conn.execute(stmt).all())

    def trace_versions(self, run_id: str, limit: int = 1000) -> tuple[str | None, tuple[tuple[str, int], ...]]:
        """The run's trace id and (run id, version) of every run of that trace, in one round trip: it changes when
        any run of the tree is started or moves. (None, ()) for no such run."""
        me, them = T.runs.alias("me"), T.runs.alias("them")
        stmt = (select(me.c.trace_id, them.c.run_id, them.c.version)
                .join(them, them.c.trace_id == me.c.trace_id).where(me.c.run_id == run_id)
                .order_by(them.c.created_at, them.c.run_id).limit(limit))
        with self.reading() as conn:
            rows = conn.execute(stmt).all()
        return (rows[0].trace_id if rows else None), tuple((r.run_id, r.version) for r in rows)

    def recent_runs(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` runs' time, state, tokens and cost (what a chart of runs over time plots): read from
        the creation index, so the cost is the limit's, not the table's."""
        c = T.runs.c
        stmt = (select(c.created_at, c.state, c.input_tokens, c.output_tokens, c.cost_usd)
                .order_by(c.created_at.desc(), c.run_id.desc()).limit(limit))
        with self.reading() as conn:
            return [{"created_at": as_utc(r.created_at), "state": r.state, "tokens": r.input_tokens + r.output_tokens,
                     "cost_usd": r.cost_usd} for r in conn.execute(stmt).all()]

    def audit_trail(self, run_id: str) -> list[dict[str, Any]]:
        """A run's state transitions, oldest first (empty when the audit hook is off)."""
        with self.reading() as conn:
            rows = conn.execute(select(T.audit).where(T.audit.c.run_id == run_id).order_by(T.audit.c.id)).all()
        return [{**r._mapping, "at": as_utc(r.at)} for r in rows]

    def children(self, run_id: str, conn: Connection | None = None) -> list[RunRecord]:
        """Runs started by this run's delegations, oldest first."""
        stmt = select(T.runs).where(T.runs.c.parent_run_id == run_id).order_by(T.runs.c.created_at, T.runs.c.run_id)
        if conn is not None:
            return [RunRecord.from_row(r) for r in conn.execute(stmt).all()]
        with self.reading() as own:
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
        with self.reading() as own:
            return [RunRecord.from_row(r) for r in own.execute(stmt).all()]
