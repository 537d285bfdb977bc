"""Approvals: a call waiting for a person, their answer, and whether that answer has been sent and applied."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, bindparam, select, update

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import APPROVAL_PENDING, LIVE, ApprovalRecord, now

_A = T.approvals.c
_PENDING = (select(T.approvals).join(T.runs, T.runs.c.run_id == _A.run_id)  # waiting on live runs, oldest first
            .where(LIVE, _A.status == APPROVAL_PENDING).order_by(_A.requested_at))
# The observer's approvals timer runs these every second in every observer, most often finding nothing: built once
# (a statement built per call cost as much CPU as running it).
_EXPIRED = _PENDING.where(_A.expires_at <= bindparam("at")).limit(bindparam("limit"))
_UNAPPLIED = (select(T.approvals, T.runs.c.trace_id).join(T.runs, T.runs.c.run_id == _A.run_id)
              .where(_A.status != APPROVAL_PENDING, _A.applied_at.is_(None),
                     (_A.sent_at.is_(None) & (_A.resolved_at <= bindparam("unsent_before")))
                     | (_A.sent_at <= bindparam("sent_before")),
                     LIVE)  # an ended run has nothing to apply an answer to
              .order_by(_A.resolved_at).limit(bindparam("limit")))


class Approvals(StoreBase):
    """Calls waiting for a person, and their answers."""

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
            with self.reading() as own:
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
        stmt = _PENDING.where(_A.run_id == run_id) if run_id else _PENDING
        return self._approvals(stmt.limit(limit), {})

    def expired_approvals(self, at: datetime, limit: int = 200) -> list[ApprovalRecord]:
        return self._approvals(_EXPIRED, {"at": at, "limit": limit})

    def _approvals(self, stmt: Select[Any], values: dict[str, Any]) -> list[ApprovalRecord]:
        with self.reading() as conn:
            return [ApprovalRecord.from_row(r) for r in conn.execute(stmt, values).all()]

    def unapplied_approvals(self, unsent_before: datetime, sent_before: datetime, limit: int = 200
                            ) -> list[tuple[ApprovalRecord, str]]:
        """Answers the observer has not acted on, with their run's trace id: those answered before
        ``unsent_before`` whose approval.resolved was never confirmed sent (the answerer died or lost the
        broker, or had none), and those sent before ``sent_before`` (lost since: no queue is that slow)."""
        values = {"unsent_before": unsent_before, "sent_before": sent_before, "limit": limit}
        with self.reading() as conn:
            return [(ApprovalRecord.from_row(r), r.trace_id) for r in conn.execute(_UNAPPLIED, values).all()]

    def approvals_of(self, run_id: str) -> list[ApprovalRecord]:
        """A run's requests and answers, in the order they were asked."""
        stmt = select(T.approvals).where(T.approvals.c.run_id == run_id).order_by(T.approvals.c.requested_at)
        with self.reading() as conn:
            return [ApprovalRecord.from_row(r) for r in conn.execute(stmt).all()]
