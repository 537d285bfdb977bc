"""Retention: ended runs past their keeping time deleted with everything that hangs off them, in batches.

The policy is ``AGENTFLEET_RETENTION_DAYS`` with each agent's ``retention_days`` over it; ``agentfleet prune
--older-than`` replaces the first for one pass (an agent's own keeping time still holds: it is its author's
word, say a compliance period, and an operator's one-off command should not cut it short). Observer workers
apply the policy every ``retention_interval_s``, one pass fleet-wide at a time. Dead letters are deleted by the
command only (``ops.retention``): each is kept for a person to look at, and the timer does not decide they have.

A pass deletes a batch of runs per transaction and pauses between batches, so the hot path's transactions never
queue behind it for longer than one batch takes; a run is deleted whole or not at all. What a deleted run leaves
behind is deleted after it: artifacts no run links any more, and, past the default keeping time, tool health
history, dedupe marks of events that named no run, outside domain events and dead letters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agentfleet.store.records import now
from agentfleet.store.repository import Store
from agentfleet.store.retention import FREED

log = logging.getLogger(__name__)

PRUNE_BATCH = 200  # runs deleted per transaction
PRUNE_PAUSE_S = 0.05  # between two batches at least: what the hot path waited on is free meanwhile
# And at least this many times what the batch took: a pass works a fifth of its time, so the fleet beside it (which
# shares the database and, on a small machine, the cores) keeps most of both. Retention is never in a hurry.
PRUNE_REST_FACTOR = 4.0
ORPHAN_BATCH = 500  # unlinked artifacts, and rows of history, per transaction
RETENTION_LOCK = "agentfleet/retention"


@dataclass(frozen=True)
class Cutoff:
    """Runs of these agents (``agents``; None: every agent not in ``other_than``) that ended before ``before``."""

    before: datetime
    agents: tuple[str, ...] | None = None
    other_than: tuple[str, ...] = ()

    def describe(self) -> str:
        who = ", ".join(self.agents) if self.agents is not None else (
            "every other agent" if self.other_than else "every agent")
        return f"{who}: ended before {self.before.isoformat(timespec='seconds')}"


def cutoffs(default_days: float | None, per_agent: Mapping[str, float | None], at: datetime) -> list[Cutoff]:
    """The policy as cutoffs: one per keeping time an agent declares, and the default for the rest (none when
    there is no default: those are kept for ever)."""
    own = {name: days for name, days in per_agent.items() if days is not None}
    found: list[Cutoff] = []
    for days in sorted(set(own.values())):
        agents = tuple(sorted(name for name, d in own.items() if d == days))
        found.append(Cutoff(at - timedelta(days=days), agents=agents))
    if default_days is not None:
        found.append(Cutoff(at - timedelta(days=default_days), other_than=tuple(sorted(own))))
    return found


@dataclass
class PruneReport:
    """What one pass deleted (or, in a dry run, would delete), and the database's size around it."""

    dry_run: bool
    policy: list[str]
    runs: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    dead_letters: int | None = None  # None: not looked at (no broker, or no default keeping time)
    bytes_before: int | None = None
    bytes_after: int | None = None
    freed_bytes: int | None = None  # Postgres: what the deleted runs' rows took (reused by new rows)
    seconds: float = 0.0

    def add(self, counts: Mapping[str, int]) -> None:
        for table, n in counts.items():
            if table == FREED:
                self.freed_bytes = (self.freed_bytes or 0) + n
                continue
            if table == "runs":
                self.runs += n
            self.rows[table] = self.rows.get(table, 0) + n

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "policy": self.policy, "runs": self.runs,
                "rows": dict(sorted(self.rows.items())), "dead_letters": self.dead_letters,
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after, "freed_bytes": self.freed_bytes,
                "seconds": round(self.seconds, 3)}


def prune(store: Store, policy: Iterable[Cutoff], *, dry_run: bool = False, history_before: datetime | None = None,
          dead_letters: Callable[[datetime, bool], int] | None = None, batch: int = PRUNE_BATCH,
          pause_s: float = PRUNE_PAUSE_S) -> PruneReport:
    """One pass of ``policy`` over the store. ``history_before``: the default keeping time's cutoff, for what
    belongs to no run (None: that is kept). ``dead_letters(before, dry_run)`` purges (or counts) dead letters that
    died before it, when given."""
    started = time.monotonic()
    policy = list(policy)
    report = PruneReport(dry_run=dry_run, policy=[c.describe() for c in policy], bytes_before=store.database_bytes())
    for cut in policy:
        after: tuple[str, datetime] | None = None
        while page := store.prunable_runs(cut.before, agents=cut.agents, other_than=cut.other_than,
                                          after=(after[1], after[0]) if after else None, limit=batch):
            began = time.monotonic()
            ids = [run_id for run_id, _ in page]
            report.add(store.rows_of_runs(ids) if dry_run else store.delete_runs(ids))
            after = page[-1]
            if len(page) < batch:
                break
            _rest(began, pause_s)
    if policy:  # content no run links any more is garbage whoever's runs linked it
        unlinked_before = max(c.before for c in policy)
        if dry_run:
            report.add({"artifacts": len(store.orphan_artifacts(unlinked_before, 1 << 30))})
        else:
            while refs := store.orphan_artifacts(unlinked_before, ORPHAN_BATCH):
                done = store.delete_artifacts(refs, unlinked_before)
                report.add(done)
                if len(refs) < ORPHAN_BATCH or not done["artifacts"]:
                    break
                time.sleep(pause_s)
    if history_before is not None:
        if dry_run:
            report.add(store.count_history(history_before))
        else:
            while True:
                done = store.delete_history(history_before, ORPHAN_BATCH)
                report.add(done)
                if max(done.values(), default=0) < ORPHAN_BATCH:
                    break
                time.sleep(pause_s)
        if dead_letters is not None:
            report.dead_letters = dead_letters(history_before, dry_run)
    report.bytes_after = store.database_bytes()
    report.seconds = time.monotonic() - started
    return report


def _rest(began: float, pause_s: float) -> None:
    """Sleep between two batches: ``pause_s``, or ``PRUNE_REST_FACTOR`` times what the batch took if longer (none
    when ``pause_s`` is 0: tests)."""
    if pause_s > 0:
        time.sleep(max(pause_s, PRUNE_REST_FACTOR * (time.monotonic() - began)))


def policy_of(default_days: float | None, agents: Iterable[Any], at: datetime | None = None) -> list[Cutoff]:
    """The policy of these agents (each with ``name`` and ``retention_days``) over the default."""
    return cutoffs(default_days, {a.name: getattr(a, "retention_days", None) for a in agents}, at or now())


def apply_policy(store: Store, default_days: float | None, agents: Iterable[Any], *,
                 dead_letters: Callable[[datetime, bool], int] | None = None) -> PruneReport | None:
    """One pass of the configured policy (the observers' timer), or None when another process is running one or
    there is nothing to apply."""
    at = now()
    policy = policy_of(default_days, agents, at)
    if not policy:
        return None
    with store.step_lock(RETENTION_LOCK) as claimed:
        if not claimed:
            return None
        history = at - timedelta(days=default_days) if default_days is not None else None
        return prune(store, policy, history_before=history, dead_letters=dead_letters)
