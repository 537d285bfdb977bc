"""Graphs: ``graph show NAME`` (its Mermaid picture, or its problems) and ``graph replay RUN --from NODE`` (a new
run from that node, with the state as it was there)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from agentfleet.agents.registry import fleet_agents
from agentfleet.cli.app import graph_app
from agentfleet.cli.common import (
    STILL_RUNNING,
    EmbeddedOpt,
    _exit_for,
    _json_arg,
    _print_result,
    _runtime,
    _settings,
    err,
    out,
)
from agentfleet.config.settings import get_settings


@graph_app.command("show")
def show(name: Annotated[str, typer.Argument(help="The graph's name (as goals name it)")],
         as_json: Annotated[bool, typer.Option("--json", help="Print its nodes and edges as JSON")] = False) -> None:
    """Print a graph as a Mermaid flowchart (paste it into any Markdown that renders Mermaid)."""
    from agentfleet.graphs import mermaid
    from agentfleet.ops.graphs import graph_of

    graph = graph_of(fleet_agents(get_settings()), name)
    if as_json:
        print(json.dumps({
            "name": graph.name, "state": graph.state.model_json_schema(),
            "nodes": [{"name": n.name, "kind": n.kind, "reads": list(n.reads), "writes": list(n.writes),
                       "agent": n.agent, "tool": n.tool.name if n.tool else None, "retries": n.policy.retries,
                       "fallback": n.policy.fallback, "on_failure": n.policy.after_failure}
                      for n in graph.nodes.values()],
            "edges": [{"from": e.source, "to": e.target, "when": e.describe() or (None if e.when is None else "?"),
                       "each": e.each, "join": list(e.join)} for e in graph.edges]}))
        return
    print(mermaid(graph), end="")


@graph_app.command("replay")
def replay(
    run_id: Annotated[str, typer.Argument(help="A run of a graph")],
    node: Annotated[str, typer.Option("--from", help="Start the new run at this node")],
    step: Annotated[int | None, typer.Option("--step", help="The step it was due at (default: its last)")] = None,
    edit: Annotated[str | None, typer.Option("--edit", help="JSON object of state fields to change first")] = None,
    embedded: EmbeddedOpt = False,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the new run to its end")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait or --embedded")] = 600.0,
) -> None:
    """Fork a graph run: a new run that starts at NODE with the state as it was when NODE was due, optionally
    edited (LangGraph's time travel, run by the fleet). The old run is left as it is."""
    from agentfleet.ops.graphs import fork_goal

    changes = _json_arg(edit, "--edit") if edit else None
    settings = _settings(embedded)
    rt = _runtime(settings)
    body = fork_goal(rt.store, rt.agents, run_id, node, edit=changes, step=step)
    if embedded:
        from agentfleet.cli.goals import _run_embedded

        _run_embedded(body["agent"], body, None, as_json, timeout)
        return
    from agentfleet.ops.client import FleetClient

    with FleetClient(settings) as client:
        new_run = client.run_id(body)
        if not wait:
            client.publish_goal(body)
            print(json.dumps({"run_id": new_run, "goal_id": body["goal_id"], "forked_from": run_id})
                  if as_json else new_run)
            return
        if not as_json:
            out.print(f"run {new_run} (forked from {run_id} at {node})")
        result = client.submit_and_wait(body, timeout_s=timeout)
    if result is None:
        err.print(f"still running after {timeout:g}s (the run goes on): agentfleet status {new_run}")
        raise typer.Exit(STILL_RUNNING)
    _print_result(result, as_json)
    _exit_for(result)
