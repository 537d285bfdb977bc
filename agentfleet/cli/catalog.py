"""What the fleet offers: ``agents``, ``plugins``, ``tools``, ``health``, ``schema``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentfleet.agents.registry import fleet_agents
from agentfleet.config.settings import get_settings
from agentfleet.errors import ConfigurationError
from agentfleet.events.contracts import Goal, Result

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import app
from agentfleet.cli.common import _runtime, err, out


@app.command()
def agents(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """List the agents this configuration loads, with their goal schemas."""
    registry = fleet_agents(get_settings())
    specs = {n: {"tools": list(a.tools), "goal_schema": a.goal_schema, "result_schema": a.result_schema,
                 "model": a.model.name, "limits": a.limits.model_dump()}
             for n in registry.names() if (a := registry.get(n))}
    if as_json:
        print(json.dumps(specs))
        return
    for name, spec in specs.items():
        out.print(f"[cyan]{name}[/] model={spec['model']} tools={', '.join(spec['tools'])}")


@app.command()
def plugins(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """Every plugin found (installed entry points, AGENTFLEET_PLUGIN_PATHS folders): source, version, state.

    Exits 2 with the reason when they cannot all be loaded (the fleet's workers would not start)."""
    from agentfleet.agents.plugins import discover, plan

    settings = get_settings()
    try:
        states = plan(discover(settings.plugin_folders, entry_points=settings.plugin_entry_points),
                      settings.disabled_plugins)
    except ConfigurationError as exc:
        err.print(f"[bold red]plugins cannot load[/]: {exc}")
        raise typer.Exit(2) from None
    rows = [{"name": p.spec.name, "version": p.spec.version, "state": p.state, "order": i + 1,
             "source": p.spec.source, "requires": p.spec.requires, "modules": list(p.spec.modules)}
            for i, p in enumerate(states)]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("#", "plugin", "version", "state", "requires", "source", title=f"{len(rows)} plugin(s), in load "
                                                                                 "order")
    for r in rows:
        needs = ", ".join(f"{n} {v}".strip() for n, v in r["requires"].items()) or "-"
        colour = "green" if r["state"] == "enabled" else "dim"
        table.add_row(str(r["order"]) if r["state"] == "enabled" else "-", r["name"], r["version"],
                      f"[{colour}]{r['state']}[/]", needs, r["source"])
    (out if out.is_terminal else Console(width=240)).print(table)


@app.command()
def tools(
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's tools")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Every tool with its agent, tier, timeout, fallback and lock, and the fleet's view of its health."""
    from agentfleet.ops.fleet import tools_view

    rt = _runtime(get_settings())
    view = tools_view(rt, agent)
    if agent is not None and not view["agents"]:
        err.print(f"no agent {agent!r} (loaded: {', '.join(rt.agents.names())})")
        raise typer.Exit(2)
    rows, reachable = view["tools"], view["redis"] == "reachable"
    if as_json:
        print(json.dumps({"redis": view["redis"], "tools": rows}, default=str))
        return
    if rt.settings.embedded:
        out.print("[yellow]embedded profile:[/] health, breakers and the cache live inside the running process; "
                  "this shows declarations only")
    elif not reachable:
        out.print(f"[bold red]Redis unreachable[/] at {rt.settings.redis_url}: gates fail open (every tool counts "
                  "as healthy), breakers and the cache are skipped, tools that declare a lock refuse to run")
    table = Table("agent", "tool", "kind", "tier", "timeout", "idem/ro", "fallback", "lock", "health", "age", "detail",
                  "breaker", "cache hits")
    for r in rows:
        colour = {"healthy": "green", "down": "red"}.get(r["health"], "dim")
        table.add_row(r["agent"], r["tool"], r["kind"], r["tier"] or "-", f"{r['timeout_s']:g}s",
                      f"{'I' if r['idempotent'] else '-'}{'R' if r['read_only'] else '-'}", r["fallback"] or "-",
                      r["lock"] or "-", f"[{colour}]{r['health']}[/]",
                      "-" if r["age_s"] is None else f"{r['age_s']:.0f}s", (r["detail"] or "-")[:60],
                      r["breaker"], str(r["cache_hits"]))
    out.print(table)


@app.command()
def health(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """Exit 0 when the fleet's Redis and every declared health check are healthy, 1 otherwise.

    For a container healthcheck. A check with no fresh answer in Redis is run here. Also says how this host
    bounds each sandboxed call (its own uid, cgroup, tmpfs sizes), or that it cannot.
    """
    from agentfleet.fleet.health_cache import plan_checks
    from agentfleet.harness.checks import run_check
    from agentfleet.sandbox.call_bounds import host_bounds

    rt = _runtime(get_settings())
    reachable = rt.redis.fail_open(lambda r: bool(r.ping()), False)
    plans = plan_checks(t for a in rt.agents.all() for t in a.tools.values())
    checks: dict[str, dict[str, Any]] = {}
    for name, plan in plans.items():
        entries = rt.dispatch.health.entries(plan.tools) if reachable else {}
        known = [e for e in entries.values() if e is not None]
        if known:
            worst = min(known, key=lambda e: e.status == "healthy")
            checks[name] = {"status": worst.status, "detail": worst.detail, "checked_by": worst.checked_by}
        else:
            outcome = run_check(plan.check, rt.dispatch.health.timeout_s(plan.check))
            checks[name] = {"status": "healthy" if outcome.healthy else "down", "detail": outcome.detail,
                            "checked_by": "here"}
    healthy = reachable and all(c["status"] == "healthy" for c in checks.values())
    bounds = host_bounds().describe()
    if as_json:
        print(json.dumps({"healthy": healthy, "redis": "reachable" if reachable else "unreachable",
                          "checks": checks, "per_call_bounds": bounds}))
    else:
        out.print(f"redis {'[green]reachable[/]' if reachable else '[red]unreachable[/]'} "
                  f"({rt.settings.redis_url if not rt.settings.embedded else 'in-process'})")
        for name, c in checks.items():
            colour = "green" if c["status"] == "healthy" else "red"
            out.print(f"check {name}: [{colour}]{c['status']}[/] {c['detail'] or ''} (by {c['checked_by']})")
        for bound, how in bounds.items():
            out.print(f"per call, {bound}: {how}", markup=False, highlight=False)
    raise typer.Exit(0 if healthy else 1)


@app.command()
def schema() -> None:
    """Print the public wire contracts (goal, approval answer, Result, public notices, step notices) as JSON
    Schema, for non-Python clients."""
    from agentfleet.events.contracts import (
        STEP_NOTICES,
        ApprovalAnswer,
        ApprovalNotice,
        ApprovalResolve,
        DomainNotice,
        GraphStepNotice,
        RunNotice,
        ToolHealthNotice,
    )

    print(json.dumps({"goal": Goal.model_json_schema(), "result": Result.model_json_schema(),
                      "run.completed|run.failed": RunNotice.model_json_schema(),
                      "domain.<name>": DomainNotice.model_json_schema(),
                      "approval.resolve": ApprovalResolve.model_json_schema(),
                      "approval.answer": ApprovalAnswer.model_json_schema(),
                      "approval.requested|approval.resolved": ApprovalNotice.model_json_schema(),
                      "tool.health_changed": ToolHealthNotice.model_json_schema(),
                      "graph.step": GraphStepNotice.model_json_schema(),
                      **{name: model.model_json_schema() for name, model in STEP_NOTICES.items()}}, indent=2))
