"""Tool calls waiting for a person, as the CLI lists them and the console shows them (answers: ``ops.actions``)."""

from __future__ import annotations

from typing import Any

from agentfleet.store.records import ApprovalRecord
from agentfleet.store.repository import Store

PENDING_LIMIT = 1000


def pending_approvals(store: Store, *, run_id: str | None = None, limit: int = PENDING_LIMIT) -> list[ApprovalRecord]:
    """Requests waiting on runs still live, oldest first (``summary()`` is what people may see of each)."""
    return store.pending_approvals(run_id=run_id, limit=limit)


def pending_mark(store: Store, limit: int = PENDING_LIMIT) -> tuple[str, ...]:
    """What changes when a request is asked or answered (a live approvals page redraws then)."""
    return tuple(r.approval_id for r in store.pending_approvals(limit=limit))


def approvals_of(store: Store, run_id: str) -> list[dict[str, Any]]:
    """A run's requests and answers, in the order asked, as people may see them (arguments and edits masked)."""
    return [a.summary() for a in store.approvals_of(run_id)]
