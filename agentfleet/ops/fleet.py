"""The fleet as an operator sees it: workers by role with pool sizes, queue depths, and the tools with their
health, breaker and cache (``agentfleet workers`` and ``tools``, and the console's fleet page)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentfleet import constants as C
from agentfleet.events.publisher import queue_depths
from agentfleet.ops.control import live_workers, tool_queues_view
from agentfleet.roles.runtime import Runtime


def tools_view(rt: Runtime, agent: str | None = None) -> dict[str, Any]:
    """Each loaded agent's tools (or one agent's) with the fleet's facts about them, and whether Redis (where those
    facts live) answered."""
    agents = [a for a in rt.agents.all() if agent is None or a.name == agent]
    rows = [{"agent": a.name, **row} for a in agents for row in rt.dispatch.status(list(a.tools.values()))]
    reachable = rt.redis.fail_open(lambda r: bool(r.ping()), False)
    return {"redis": "reachable" if reachable else "unreachable", "tools": rows, "agents": [a.name for a in agents]}


def workers_view(rt: Runtime, *, timeout_s: float = 2.0, declared_tool_queues: tuple[str, ...] = ()
                 ) -> dict[str, Any]:
    """The namespace's live workers grouped by role, each role's queue depth, and the dedicated tool queues."""
    app = rt.publisher.app
    found = live_workers(app, rt.topology, timeout_s)
    depths = queue_depths(app, rt.topology)
    roles = {role: {"workers": [dataclasses.asdict(w) for w in found if role in w.roles],
                    "threads": sum(w.size for w in found if role in w.roles), "queue_depth": depths.get(role)}
             for role in C.ROLES}
    return {"roles": roles, "workers": [dataclasses.asdict(w) for w in found], "queue_depths": depths,
            "tool_queues": tool_queues_view(app, rt.topology, found, declared_tool_queues)}
