"""The audit trail as a hook: one row per run state transition, in the transition's own transaction.

A row therefore exists exactly when the move it records committed: a step that
rolls back (or is retried) leaves none, and two workers racing to move a run leave
one, the winner's. It names what moved the run (the event and the worker handling
it; none when the sweeper or the CLI did), why (the error code a run ended with),
how long the step had taken, and what the run had cost by then.
"""

from __future__ import annotations

import os
import socket
import time

from sqlalchemy import Connection, insert

from agentfleet.hooks.base import Hook, Transition, current_step
from agentfleet.store import tables as T


class AuditHook(Hook):
    def __init__(self) -> None:
        self.process = f"{socket.gethostname()}:{os.getpid()}"

    def on_transition(self, conn: Connection, change: Transition) -> None:
        step = current_step()
        conn.execute(insert(T.audit).values(
            at=change.at, run_id=change.run_id, agent=change.agent, from_state=change.from_state,
            to_state=change.to_state, iteration=change.iteration,
            event_id=step.event_id if step else None, event_type=step.event_type if step else None,
            reason=change.error_code,
            step_duration_ms=round((time.perf_counter() - step.started) * 1000, 3) if step else None,
            input_tokens=change.input_tokens, output_tokens=change.output_tokens, cost_usd=change.cost_usd,
            worker=(step.worker if step else self.process)[:255],
        ))
