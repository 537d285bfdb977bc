"""``agentfleet prune``: ended runs past their keeping time deleted, with what hangs off them."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from agentfleet.cli.app import app
from agentfleet.cli.common import EmbeddedOpt, _runtime, _settings, out


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


@app.command()
def prune(
    older_than: Annotated[str | None, typer.Option("--older-than", help=(
        "Delete runs that ended longer ago than this (30d, 12h): replaces AGENTFLEET_RETENTION_DAYS for this "
        "pass; an agent's own retention_days still holds"))] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing")] = False,
    keep_dead_letters: Annotated[bool, typer.Option("--keep-dead-letters",
                                                    help="Leave the dead-letter queue as it is")] = False,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Delete ended runs past their keeping time with their steps, transcript, audit rows, approvals and the
    artifacts no run links any more, in batches the fleet keeps running beside; dead letters past it too.
    Prints the database's size before and after."""
    from datetime import timedelta

    from agentfleet.ops.durations import parse_since
    from agentfleet.ops.retention import prune_now
    from agentfleet.store.records import now

    rt = _runtime(_settings(embedded))
    age: timedelta | None = None
    if older_than is not None:
        at = now()
        age = at - parse_since(older_than, at, option="--older-than")
        if age.total_seconds() <= 0:
            raise typer.BadParameter("give a time in the past", param_hint="--older-than")
    elif rt.settings.retention_days is None and not any(a.retention_days for a in rt.agents.all()):
        raise typer.BadParameter("no keeping time: set AGENTFLEET_RETENTION_DAYS, an agent's retention_days, "
                                 "or give one", param_hint="--older-than")
    report = prune_now(rt, older_than=age, dry_run=dry_run, agents=list(rt.agents.all()),
                       dead_letters=not keep_dead_letters)
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    verb = "would delete" if dry_run else "deleted"
    for line in report.policy:
        out.print(f"policy  {line}", markup=False, highlight=False)
    rows = ", ".join(f"{table} {n}" for table, n in sorted(report.rows.items()) if n and table != "runs")
    out.print(f"{verb} {report.runs} run(s){': ' + rows if rows else ''}", markup=False, highlight=False)
    if report.dead_letters is not None:
        out.print(f"{verb} {report.dead_letters} dead letter(s)", markup=False, highlight=False)
    freed = (f"; the runs' rows took {_size(report.freed_bytes)}, which new rows reuse (the file shrinks only "
             "with VACUUM FULL)") if report.freed_bytes else ""
    out.print(f"db {_size(report.bytes_before)} before, {_size(report.bytes_after)} after "
              f"({report.seconds:.1f} s){freed}", markup=False, highlight=False)
