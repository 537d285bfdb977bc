"""The audit log as a hook: each committed run transition appended to a file as a JSON line.

The ``audit`` table is the store's: it writes one row per transition in the
transition's own transaction (``Store(audit=True)``, ``AGENTFLEET_AUDIT``), so a row
exists exactly when the move it records committed. A file cannot roll back with a
transaction, so this hook writes each record after its move committed: the same
record the table holds (``Transition.record``), never to stdout.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from agentfleet.hooks.base import Hook, Transition


class AuditHook(Hook):
    """JSON lines appended to ``log_path`` once each move has committed."""

    def __init__(self, *, log_path: Path) -> None:
        self.log_path = log_path
        self._appending = threading.Lock()

    def after_transition(self, change: Transition) -> None:
        line = json.dumps(change.record(), default=str) + "\n"
        with self._appending, self.log_path.open("a", encoding="utf-8") as f:  # one write per line: O_APPEND
            f.write(line)
