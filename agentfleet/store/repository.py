"""The only place that reads and writes the tables: one ``Store`` over one module per kind of record.

Handlers pass a connection for writes that must commit together (a step's
outcome, the run's transition and the events to publish); reads that stand
alone open their own. Each kind of record (runs, steps, transcript, outbox,
approvals, artifacts, spend, events, the sweeper's view, secrets, retention, threads, schedules, operators'
actions) is a module of this package; ``Store`` is their sum, so a caller holds one object.
"""

from __future__ import annotations

from agentfleet.store.actions import Actions
from agentfleet.store.approvals import Approvals
from agentfleet.store.artifacts import Artifacts
from agentfleet.store.events import Events
from agentfleet.store.outbox import Outbox
from agentfleet.store.retention import Retention
from agentfleet.store.runs import Runs
from agentfleet.store.schedules import Schedules
from agentfleet.store.secrets import Secrets
from agentfleet.store.spend import Spend
from agentfleet.store.steps import Steps
from agentfleet.store.sweeping import Sweeping
from agentfleet.store.threads import Threads
from agentfleet.store.transcript import Transcripts

__all__ = ["Store"]


class Store(Runs, Steps, Transcripts, Outbox, Approvals, Artifacts, Spend, Sweeping, Events, Secrets,
            Retention, Threads, Schedules, Actions):
    """Every kind of record, on one engine (``StoreBase`` holds the engine, the hooks and the transactions)."""
