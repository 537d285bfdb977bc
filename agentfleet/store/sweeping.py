"""What the sweeper reads: runs gone quiet, the last sign of life of one, and the note that it was redriven."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Select, func, select, union_all, update

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import RunRecord, as_utc, now


class Sweeping(StoreBase):
    """The sweeper's queries."""

    def quiet_runs(self, before: datetime, limit: int, after: tuple[datetime, str] | None = None
                   ) -> list[RunRecord]:
        """Runs whose row has not changed (nor been re-driven) since ``before``: live ones, and ended
        ones with a Result still owed to a reply_to. Oldest first, a page at a time (``after`` the
        last one seen), so runs that are only waiting never hide stalled ones behind them."""
        with self.reading() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(self.quiet_runs_query(before, limit, after)).all()]

    @staticmethod
    def quiet_runs_query(before: datetime, limit: int, after: tuple[datetime, str] | None = None) -> Select:
        """Two pages merged, each read through an index of its own rows only (migration 0013), so ended runs
        whose Result was delivered cost nothing however many: live runs (``ix_runs_live``; its predicate written
        as constant text, ``tables.LIVE_SQL``, which the planner can match, unlike bound parameters), and ended runs
        still owing a Result (``ix_run_replies_owed``). Each page is a subquery of its own: SQLite takes no ORDER
        BY or LIMIT on a bare member of a UNION."""
        quiet = [T.runs.c.updated_at < before, (T.runs.c.redriven_at.is_(None)) | (T.runs.c.redriven_at < before)]
        if after is not None:
            quiet.append((T.runs.c.updated_at > after[0])
                         | ((T.runs.c.updated_at == after[0]) & (T.runs.c.run_id > after[1])))
        order = (T.runs.c.updated_at, T.runs.c.run_id)
        owed = select(T.run_replies.c.run_id).where(T.run_replies.c.delivered_at.is_(None))
        live = select(T.runs).where(T.LIVE_SQL, *quiet).order_by(*order).limit(limit)
        ended = (select(T.runs).where(T.runs.c.state.in_(list(T.ENDED)), T.runs.c.run_id.in_(owed), *quiet)
                 .order_by(*order).limit(limit))
        both = union_all(select(live.subquery()), select(ended.subquery())).subquery()
        return select(both).order_by(both.c.updated_at, both.c.run_id).limit(limit)

    def last_activity(self, run: RunRecord) -> datetime:
        """The latest sign of life of a run: its row, a step starting or finishing, a tool result arriving."""
        with self.reading() as conn:
            times = conn.execute(
                select(func.max(T.steps.c.started_at), func.max(T.steps.c.finished_at))
                .where(T.steps.c.run_id == run.run_id)
            ).one()
            received = conn.execute(
                select(func.max(T.observations.c.received_at)).where(T.observations.c.run_id == run.run_id)
            ).scalar()
        candidates = [run.updated_at, run.redriven_at, *times, received]
        return max(t for t in map(as_utc, candidates) if t is not None)

    def note_redrive(self, conn: Connection, run_id: str) -> None:
        conn.execute(update(T.runs).where(T.runs.c.run_id == run_id)
                     .values(redrives=T.runs.c.redrives + 1, redriven_at=now()))
