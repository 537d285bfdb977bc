"""The audit trail as a hook: one row per run state transition, in the transition's own transaction.

A row therefore exists exactly when the move it records committed: a step that
rolls back (or is retried) leaves none, and two workers racing to move a run leave
one, the winner's. It names what moved the run (the event and the worker handling
it; none when the sweeper or the CLI did), why (the error code a run ended with),
how long the step had taken, and what the run had cost by then.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert

from agentfleet.hooks.base import Hook, Transition, current_step
from agentfleet.store import tables as T


class AuditHook(Hook):
    """Rows in the ``audit`` table (``table``), and/or JSON lines appended to ``log_path`` once each move has
    committed (a file cannot roll back with the transaction, so it is written after it; never to stdout)."""

    def __init__(self, *, table: bool = True, log_path: Path | None = None) -> None:
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self.table = table
        self.log_path = log_path
        self._appending = threading.Lock()

    def _record(self, change: Transition) -> dict[str, Any]:
        step = current_step()
        return dict(
            at=change.at, run_id=change.run_id, agent=change.agent, from_state=str(change.from_state),
            to_state=str(change.to_state), iteration=change.iteration,
            event_id=step.event_id if step else None, event_type=step.event_type if step else None,
            reason=change.error_code,
            step_duration_ms=round((time.perf_counter() - step.started) * 1000, 3) if step else None,
            input_tokens=change.input_tokens, output_tokens=change.output_tokens, cost_usd=change.cost_usd,
            worker=(step.worker if step else self.process)[:255],
        )

    def on_transition(self, conn: Connection, change: Transition) -> None:
        if self.table:
            conn.execute(insert(T.audit).values(**self._record(change)))

    def after_transition(self, change: Transition) -> None:
        if self.log_path is None:
            return
        line = json.dumps(self._record(change), default=str) + "\n"
        with self._appending, self.log_path.open("a", encoding="utf-8") as f:  # one write per line: O_APPEND
            f.write(line)
