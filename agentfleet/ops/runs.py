"""Pages of runs, newest first, for the CLI's ``runs`` and the console: filters, a keyset cursor, one row shape.

A page is read from an index in order (migration 0019) and carries the cursor of its last run: the next page
starts after it, so page 500 costs what page 1 does, and runs created meanwhile never shift a page.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentfleet.errors import BadQuery
from agentfleet.loop.states import RunState
from agentfleet.store.records import RunRecord
from agentfleet.store.repository import Store

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class RunsQuery:
    agent: str | None = None
    states: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    goal_id: str | None = None
    cursor: str | None = None  # from a page's ``next_cursor``
    limit: int = PAGE_SIZE

    def __post_init__(self) -> None:
        unknown = [s for s in self.states if s not in RunState.__members__]
        if unknown:
            raise BadQuery(f"unknown state {', '.join(unknown)}; one of {', '.join(RunState.__members__)}")
        if not 1 <= self.limit <= MAX_PAGE_SIZE:
            raise BadQuery(f"a page holds 1 to {MAX_PAGE_SIZE} runs")


@dataclass(frozen=True)
class RunsPage:
    rows: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None  # None: this was the last page


def run_row(run: RunRecord) -> dict[str, Any]:
    """A run as a list shows it (CLI ``runs --json`` prints exactly this)."""
    return {"run_id": run.run_id, "agent": run.agent, "goal_id": run.goal_id, "state": run.state.value,
            "iteration": run.iteration, "tokens": run.input_tokens + run.output_tokens, "cost_usd": run.cost_usd,
            "unpriced": run.unpriced, "created_at": run.created_at.isoformat(timespec="seconds"),
            "updated_at": run.updated_at.isoformat(timespec="seconds"), "error_code": run.error_code,
            "parent_run_id": run.parent_run_id, "thread_id": run.thread_id}


def encode_cursor(run: RunRecord) -> str:
    raw = f"{run.created_at.isoformat()}|{run.run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, run_id = raw.split("|", 1)
        when = datetime.fromisoformat(at)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise BadQuery("not a cursor this fleet gave out") from exc
    if when.tzinfo is None or not run_id or len(run_id) > 64:
        raise BadQuery("not a cursor this fleet gave out")
    return when, run_id


def runs_page(store: Store, query: RunsQuery) -> RunsPage:
    """One page of runs matching ``query``, newest first, and the cursor of the next page."""
    before = decode_cursor(query.cursor) if query.cursor else None
    found = store.list_runs(agent=query.agent, states=query.states, since=query.since, until=query.until,
                            goal_id=query.goal_id, before=before, limit=query.limit + 1)
    shown = found[: query.limit]
    more = len(found) > query.limit
    return RunsPage([run_row(r) for r in shown], encode_cursor(shown[-1]) if more and shown else None)


def newest_mark(store: Store) -> tuple[Any, ...]:
    """What changes when a run is created, or a run of the newest page moves (a live runs list redraws then)."""
    return store.newest_versions(PAGE_SIZE)


def tree_mark(store: Store, run_id: str) -> tuple[str | None, tuple[Any, ...]]:
    """The run's trace id and what changes when any run of its tree moves (a live run page redraws then)."""
    return store.trace_versions(run_id)
