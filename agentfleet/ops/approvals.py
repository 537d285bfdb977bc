"""Tool calls waiting for a person, as the CLI lists them and the console shows them (answers: ``ops.actions``)."""

from __future__ import annotations

from agentfleet.store.records import ApprovalRecord
from agentfleet.store.repository import Store

PENDING_LIMIT = 1000


def pending_approvals(store: Store, *, run_id: str | None = None, limit: int = PENDING_LIMIT) -> list[ApprovalRecord]:
    """Requests waiting on runs still live, oldest first (``summary()`` is what people may see of each)."""
    return store.pending_approvals(run_id=run_id, limit=limit)
