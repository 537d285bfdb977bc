"""Operator views of graphs: a graph's picture, and a fork of a graph run from a node (LangGraph's time travel,
across the fleet): the goal that starts a new run at that node with the state as it was there."""

from __future__ import annotations

import uuid
from typing import Any

from agentfleet.agents.registry import AgentRegistry
from agentfleet.errors import ConfigurationError
from agentfleet.graphs.binding import replay_points
from agentfleet.graphs.definition import Graph
from agentfleet.graphs.runner import FROM_KEY
from agentfleet.store.repository import Store


def graph_of(registry: AgentRegistry, name: str) -> Graph:
    agent = registry.get(name)
    graph = getattr(agent, "graph", None)
    if not isinstance(graph, Graph):
        known = sorted(a.name for a in registry.all() if isinstance(getattr(a, "graph", None), Graph))
        raise ConfigurationError(f"no graph named {name!r} is loaded (graphs: {', '.join(known) or 'none'})")
    return graph


def fork_goal(store: Store, registry: AgentRegistry, run_id: str, node: str, *, edit: dict[str, Any] | None = None,
              step: int | None = None, goal_id: str | None = None) -> dict[str, Any]:
    """The goal of a new run of ``run_id``'s graph that starts at ``node`` with the state as it was when the node
    was due (its last time, or at ``step``), with ``edit``'s fields over it."""
    run = store.get_run(run_id)
    if run is None:
        raise ConfigurationError(f"no run {run_id}")
    graph = graph_of(registry, run.agent)
    points = [p for p in replay_points(graph, run.input, store.transcript(run_id)) if p[1] == node]
    if step is not None:
        points = [p for p in points if p[0] == step]
    if not points:
        raise ConfigurationError(f"node {node!r} was never due in run {run_id}"
                                 + (f" at step {step}" if step is not None else ""))
    at, _, state = points[-1]
    edited = {**state, **(edit or {})}
    unknown = sorted(set(edit or {}) - set(graph.state.model_fields))
    if unknown:
        raise ConfigurationError(f"--edit names {', '.join(unknown)}, which the state does not have")
    return {"agent": graph.name, "input": {**edited, FROM_KEY: node},
            "goal_id": goal_id or f"fork-{run_id[:8]}-{node}-{at}-{uuid.uuid4().hex[:8]}"}
