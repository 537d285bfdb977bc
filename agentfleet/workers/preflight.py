"""What a worker checks before it consumes anything: a fault it can name is an exit, not a hang or a crash later.

A worker that cannot import its agents, or whose database is behind the code's
migrations, would take messages it can only fail (the first goal died in the
planner with ``relation "processed_events" does not exist``). It stops instead,
non-zero, so a supervisor sees it, with what to fix. A database it cannot reach is
not such a fault: workers ride out outages, so that is logged and the start goes on.
"""

from __future__ import annotations

import logging

from agentfleet.config.agents import load_agents
from agentfleet.config.settings import Settings
from agentfleet.errors import ConfigurationError
from agentfleet.logs import redact
from agentfleet.store import db

log = logging.getLogger(__name__)


def preflight(settings: Settings) -> None:
    """Raise ConfigurationError naming what to fix; return when the worker may start."""
    load_agents(settings.agent_modules)
    url = settings.effective_database_url
    try:
        current, head = db.revisions(url)
    except Exception as exc:
        log.warning("database unreachable at start (%s: %s); starting anyway, steps retry until it is back",
                    type(exc).__name__, exc, extra={"database_url": redact(url)})
        return
    if current != head:
        raise ConfigurationError(f"the database at {redact(url)} is at migration {current or 'none'}, this code needs "
                                 f"{head}: run `agentfleet db upgrade` (AGENTFLEET_DATABASE_URL), then start again")
