"""Operator views of threads: which there are, and one thread's runs with what each was asked and answered."""

from __future__ import annotations

import json
from typing import Any

from agentfleet.context.thread import answer_of
from agentfleet.store.repository import Store


def threads(store: Store, limit: int = 50) -> list[dict[str, Any]]:
    return store.threads_page(limit)


def thread(store: Store, thread_id: str) -> list[dict[str, Any]]:
    """A thread's runs, oldest first: state, goal, and what each answered (as the next run is shown it)."""
    rows = []
    for run in store.thread_runs(thread_id):
        rows.append({"run_id": run.run_id, "agent": run.agent, "state": run.state.value,
                     "created_at": run.created_at.isoformat(timespec="seconds"),
                     "goal": json.dumps(run.input, sort_keys=True, default=str),
                     "answer": answer_of({"result": run.result}) if run.result else None})
    return rows
