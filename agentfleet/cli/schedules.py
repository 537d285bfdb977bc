"""``agentfleet schedule``: goals fired on cron expressions or intervals (add, list, pause, resume, delete)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentfleet.cli.app import schedule_app
from agentfleet.cli.common import EmbeddedOpt, _json_arg, _runtime, _settings, out

NameArg = Annotated[str, typer.Argument(help="The schedule's name")]


@schedule_app.command("add")
def schedule_add(
    name: NameArg,
    agent: Annotated[str, typer.Option("--agent", help="The agent its goals are for")],
    input_json: Annotated[str, typer.Option("--input", help="Each goal's input (JSON)")] = "{}",
    cron: Annotated[str | None, typer.Option("--cron", help="Five-field cron expression ('0 9 * * 1-5')")] = None,
    every: Annotated[str | None, typer.Option("--every", help="Or an interval: 10s, 5m, 1h, 1d")] = None,
    tz: Annotated[str, typer.Option("--tz", help="The cron expression's time zone (IANA: Europe/Berlin)")] = "UTC",
    jitter: Annotated[str | None, typer.Option("--jitter", help="Spread each tick up to this late (30s)")] = None,
    catch_up: Annotated[str, typer.Option(
        "--catch-up", help="Ticks missed while no scheduler ran: all fire, latest fires only the last, none")
    ] = "latest",
    thread: Annotated[str | None, typer.Option("--thread", help="Each goal continues this thread")] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Add it paused")] = False,
    embedded: EmbeddedOpt = False,
) -> None:
    """Add a schedule: observer workers fire its goals (goal id schedule:NAME:TICK), each tick once."""
    from agentfleet.ops.durations import parse_duration
    from agentfleet.ops.schedules import add_schedule, describe

    store = _runtime(_settings(embedded)).store
    added = add_schedule(store, name, agent, _json_arg(input_json, "--input"), cron=cron,
                         every_s=parse_duration(every, option="--every") if every else None, timezone=tz,
                         jitter_s=parse_duration(jitter, option="--jitter") if jitter else 0.0,
                         catch_up=catch_up, thread_id=thread, paused=paused)  # type: ignore[arg-type]
    shown = describe(added)
    out.print(f"schedule {name}: {shown['when']} ({shown['timezone']}), next at {shown['next_at']}"
              f"{' (paused)' if paused else ''}", markup=False, highlight=False)


@schedule_app.command("list")
def schedule_list(embedded: EmbeddedOpt = False,
                  as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """Every schedule: when it fires, its next tick, how often it fired and skipped."""
    from agentfleet.ops.schedules import describe

    rows = [describe(r) for r in _runtime(_settings(embedded)).store.schedules_list()]
    if as_json:
        print(json.dumps(rows, default=str))
        return
    table = Table("schedule", "agent", "when", "next at", "fired", "skipped", "state", title=f"{len(rows)} schedule(s)")
    for r in rows:
        table.add_row(r["schedule"], r["agent"], f"{r['when']} {r['timezone']}", r["next_at"] or "-", str(r["fired"]),
                      str(r["skipped"]), "paused" if r["paused"] else "active")
    (out if out.is_terminal else Console(width=200)).print(table)


@schedule_app.command("pause")
def schedule_pause(name: NameArg, embedded: EmbeddedOpt = False) -> None:
    """Fire nothing until resumed (ticks meanwhile are not caught up)."""
    from agentfleet.ops.schedules import pause_schedule

    pause_schedule(_runtime(_settings(embedded)).store, name)
    out.print(f"schedule {name} paused", markup=False, highlight=False)


@schedule_app.command("resume")
def schedule_resume(name: NameArg, embedded: EmbeddedOpt = False) -> None:
    """Fire again, from the first tick after now."""
    from agentfleet.ops.schedules import describe, resume_schedule

    resumed = describe(resume_schedule(_runtime(_settings(embedded)).store, name))
    out.print(f"schedule {name} resumed, next at {resumed['next_at']}", markup=False, highlight=False)


@schedule_app.command("delete")
def schedule_delete(name: NameArg, embedded: EmbeddedOpt = False) -> None:
    """Delete a schedule (the runs it started stay)."""
    from agentfleet.ops.schedules import delete_schedule

    delete_schedule(_runtime(_settings(embedded)).store, name)
    out.print(f"schedule {name} deleted", markup=False, highlight=False)
