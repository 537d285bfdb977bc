"""Reading and steering runs: ``status``, ``runs``, ``trace``, ``artifacts``, ``sweep``, ``cancel``."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentfleet.config.settings import get_settings

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import app
from agentfleet.cli.common import EmbeddedOpt, RunArg, _cost, _runtime, _settings, err, out


@app.command()
def status(
    run_id: Annotated[str, typer.Argument(help="Run id")],
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Show a run's state, usage, steps and approvals from its checkpoint, and whether it looks stuck."""
    from agentfleet.ops.progress import run_status

    described = run_status(_runtime(_settings(embedded)), run_id)
    if described is None:
        err.print(f"no run {run_id}")
        raise typer.Exit(2)
    stuck = described["stuck"]
    if as_json:
        print(json.dumps(described, default=str))
        return
    out.print(f"run {run_id}: [bold]{described['state']}[/] agent={described['agent']} "
              f"iteration={described['iteration']} steps={described['usage']['steps']} "
              f"tokens={described['usage']['tokens']} (cached {described['usage']['cached_input_tokens']}) "
              f"cost={_cost(described['usage']['cost_usd'], described['usage']['unpriced'])}")
    if stuck:
        out.print(f"[bold yellow]looks stuck[/]: nothing for {stuck['quiet_s']:.0f}s ({stuck['reason']}); "
                  f"the sweeper will {stuck['action']} it (now: agentfleet sweep)")
    table = Table("iteration", "kind", "name", "status", "attempts", "ms", "tokens", "cost", "worker")
    for s in described["steps"]:
        spent = (s["output"] or {}).get("usage") if s["kind"] == "plan" and isinstance(s["output"], dict) else None
        tokens = str(spent.get("input_tokens", 0) + spent.get("output_tokens", 0)) if spent else "-"
        cost = _cost(spent.get("cost_usd", 0.0), spent.get("unpriced", False)) if spent else "-"
        table.add_row(str(s["iteration"]), s["kind"], s["name"] or "-", s["status"], str(s["attempts"]),
                      f"{s['duration_ms'] or 0:.1f}", tokens, cost, s["worker"] or "-")
    out.print(table)
    if described["approvals"]:
        asked = Table("iteration", "call", "tool", "arguments", "rule", "answer", "by", "at", "note")
        for a in described["approvals"]:
            at = a["resolved_at"].isoformat(timespec="seconds") if a["resolved_at"] else "-"
            asked.add_row(str(a["iteration"]), a["call_id"], a["tool"], json.dumps(a["shown"], default=str)[:60],
                          a["rule"][:40], a["status"] + (" (edited)" if a["edited_arguments"] is not None else ""),
                          a["resolved_by"] or "-", at, (a["note"] or "-")[:60])
        out.print(asked)
    if described["parent_run_id"]:
        out.print(f"started by run {described['parent_run_id']} (a delegation)")
    if described["lineage"]:
        kind = "a retry" if described["lineage"]["kind"] == "retry" else "a fork"
        out.print(f"{kind} of run {described['lineage']['run_id']}, from its iteration "
                  f"{described['lineage']['through'] + 1}")
    if described["thread_id"]:
        out.print(f"thread {described['thread_id']}")
    if described["children"]:
        from rich.tree import Tree

        root = Tree(f"{described['agent']} {run_id} [bold]{described['state']}[/]")

        def grow(node: Tree, children: list[dict[str, Any]]) -> None:
            for c in children:
                u = c["usage"]
                branch = node.add(f"{c['agent']} {c['run_id']} [bold]{c['state']}[/]"
                                  + (f" {c['error_code']}" if c["error_code"] else "")
                                  + f" steps={u['steps']} tokens={u['tokens']} ← {c['started_by']}")
                grow(branch, c["children"])

        grow(root, described["children"])
        out.print(root)
    if described["result"]:
        out.print_json(json.dumps(described["result"]))


@app.command()
def artifacts(
    run_id: Annotated[str, typer.Argument(help="Run id")],
    ref: Annotated[str | None, typer.Option("--ref", help="Write this artifact's content to stdout")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="With --ref: write the content here")] = None,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """A run's artifacts: outputs too large for the model's context, and work directories tools kept."""
    rt = _runtime(_settings(embedded))
    if ref is not None:
        with output.open("wb") if output is not None else contextlib.nullcontext(sys.stdout.buffer) as sink:
            found = rt.store.copy_artifact(run_id, ref, sink)  # a chunk at a time: a kept tree may be large
        if not found:
            if output is not None:
                output.unlink(missing_ok=True)
            err.print(f"run {run_id} has no artifact {ref}")
            raise typer.Exit(2)
        return
    kept = rt.store.artifacts_of(run_id)
    if as_json:
        print(json.dumps(kept, default=str))
        return
    table = Table("ref", "kind", "bytes", "media type", "tool", "call", "at", title=f"{len(kept)} artifact(s)")
    for a in kept:
        table.add_row(a["ref"], a["kind"], str(a["size"]), a["media_type"], a["tool"], a["call_id"],
                      a["created_at"].isoformat(timespec="seconds"))
    (out if out.is_terminal else Console(width=240)).print(table)


@app.command()
def runs(
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's runs")] = None,
    state: Annotated[list[str] | None, typer.Option("--state", "-s", help="Only runs in this state (repeatable)")
                     ] = None,
    since: Annotated[str | None, typer.Option("--since", help="Created at most this long ago (30m, 2h, 1d) or "
                                                              "since an ISO 8601 time")] = None,
    goal: Annotated[str | None, typer.Option("--goal", help="Only runs of this goal id")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many, newest first")] = 50,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines")] = False,
) -> None:
    """List runs, newest first: state, iterations, tokens, cost and how each ended."""
    from agentfleet.errors import BadQuery
    from agentfleet.ops.durations import parse_since
    from agentfleet.ops.runs import RunsQuery, runs_page

    try:
        query = RunsQuery(agent=agent, states=tuple(s.upper() for s in state or []),
                          since=parse_since(since) if since else None, goal_id=goal, limit=limit)
    except BadQuery as exc:
        raise typer.BadParameter(exc.message, param_hint="--state / --limit") from None
    for row in runs_page(_runtime(_settings(embedded)).store, query).rows:
        if as_json:
            print(json.dumps(row))
        else:
            ended = f" {row['error_code']}" if row["error_code"] else ""
            out.print(f"{row['run_id']}  {row['created_at']}  {row['agent']}  {row['state']}{ended}  "
                      f"iterations={row['iteration'] + 1} tokens={row['tokens']} "
                      f"cost={_cost(row['cost_usd'], row['unpriced'])}", soft_wrap=True, markup=False, highlight=False)


@app.command()
def trace(
    run_id: RunArg,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """What happened to a run and why: model turns, tool calls, transitions and the end reason, in order."""
    from agentfleet.ops.trace import trace_lines, trace_of

    rt = _runtime(_settings(embedded))
    found = trace_of(rt.store, run_id, rt.agents)
    if found is None:
        err.print(f"no run {run_id}")
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(found, default=str))
        return
    for line in trace_lines(found):
        out.print(line, soft_wrap=True, markup=False, highlight=False)


@app.command()
def sweep(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be re-driven; change nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Re-drive stalled runs from their last checkpoint once (observer workers also do it on a timer)."""
    from agentfleet.roles.sweeper import sweep as sweep_once

    findings = sweep_once(_runtime(get_settings()), dry_run=dry_run)
    if findings is None:
        err.print("another sweeper is sweeping right now; nothing done")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps([{**f.__dict__, "action": f.action.value} for f in findings]))
        return
    verb = "would" if dry_run else "did"
    table = Table("run", "agent", "state", "iteration", "quiet s", f"{verb}", "why", "events",
                  title=f"{len(findings)} stalled run(s)")
    for f in findings:
        table.add_row(f.run_id, f.agent, f.state, str(f.iteration), f"{f.quiet_s:.0f}", f.action.value, f.reason,
                      str(f.events))
    (out if out.is_terminal else Console(width=200)).print(table)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="Run id")],
    reason: Annotated[str, typer.Option(help="Why")] = "cancelled by request",
) -> None:
    """Ask the fleet to cancel a run: running subprocess tools are killed, Python tools told (ctx.cancelled)."""
    from agentfleet.ops.client import FleetClient

    with FleetClient(get_settings()) as client:
        client.cancel(run_id, reason, via="cli")
    out.print(f"cancel requested for {run_id}")
