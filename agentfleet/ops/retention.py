"""``agentfleet prune``'s operator side: the policy (or ``--older-than`` over its default), dead letters too."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from agentfleet.ops.deadletters import DeadLetterQueue, Filter
from agentfleet.roles.retention import PruneReport, policy_of, prune
from agentfleet.roles.runtime import Runtime
from agentfleet.store.records import now


def prune_now(rt: Runtime, *, older_than: timedelta | None, dry_run: bool, agents: list[Any],
              dead_letters: bool = True) -> PruneReport:
    """One pass: each agent's own keeping time, and ``older_than`` (else ``AGENTFLEET_RETENTION_DAYS``) for the
    rest and for what belongs to no run. Dead letters that died before that go too (not in embedded mode, whose
    broker lives in the fleet's process)."""
    at = now()
    default_days = older_than.total_seconds() / 86400 if older_than is not None else rt.settings.retention_days
    policy = policy_of(default_days, agents, at)
    history = at - timedelta(days=default_days) if default_days is not None else None
    purge = None
    if dead_letters and not rt.settings.embedded:
        queue = DeadLetterQueue(rt.publisher.app, rt.topology, rt.publisher)

        def purge(before: datetime, dry: bool) -> int:
            match = Filter(before=before)
            return len(queue.list(match)) if dry else len(queue.purge(match))

    return prune(rt.store, policy, dry_run=dry_run, history_before=history, dead_letters=purge)
