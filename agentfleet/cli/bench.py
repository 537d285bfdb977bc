"""Measuring the fleet: ``bench`` and ``chaos``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentfleet import logs
from agentfleet.config.settings import get_settings

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import app
from agentfleet.cli.common import err, out


@app.command()
def bench(
    suite: Annotated[str | None, typer.Argument(help="overhead | throughput | recovery | growth | in_flight | graphs | "
                                                     "delegation | approvals | profile | retention | schedules | "
                                                     "console (default: all)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes, for development")] = False,
    output: Annotated[str, typer.Option(help="Where to write the figures as JSON")] = "benchmarks/results/latest.json",
) -> None:
    """Run the benchmarks (from a checkout: needs RabbitMQ, Postgres and Redis on localhost)."""

    sys.path.insert(0, str(Path.cwd()))
    try:
        from benchmarks import run as bench_run
    except ImportError:
        err.print("run `agentfleet bench` from the root of an agentfleet checkout (it has benchmarks/)")
        raise typer.Exit(2) from None
    suites = [suite] if suite else list(bench_run.SUITES)
    unknown = [s for s in suites if s not in bench_run.SUITES]
    if unknown:
        raise typer.BadParameter(f"unknown suite {unknown[0]!r}; choose from {', '.join(bench_run.SUITES)}")
    logs.configure("WARNING", True)
    sizes = bench_run.Sizes.quick() if quick else bench_run.Sizes()
    report = bench_run.run(suites, sizes)
    table = Table("suite", "metric", "value", title=f"agentfleet bench ({'quick' if quick else 'full'})")
    for row in report.rows:
        table.add_row(*row)
    console = out if out.is_terminal else Console(width=200)  # a log file gets whole rows
    console.print(table)
    console.print(json.dumps(report.figures["machine"]))
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"sizes": sizes.__dict__, **report.figures}, indent=2, default=str))
    out.print(f"figures written to {target}")


@app.command()
def chaos(
    runs: Annotated[int, typer.Option("--runs", help="Goals to submit")] = 300,
    duration: Annotated[float, typer.Option("--duration", help="Seconds of faults")] = 120.0,
    kills: Annotated[int | None, typer.Option(help="Worker kills (default: one per 10 s, at least 4)")] = None,
    restarts: Annotated[bool, typer.Option("--restarts/--no-restarts",
                                           help="Restart RabbitMQ once and Postgres once (immediate)")] = True,
    settle: Annotated[float, typer.Option(help="Seconds runs may take to end after the faults")] = 300.0,
    seed: Annotated[int | None, typer.Option(help="Random seed for the choice of victims")] = None,
    agent: Annotated[str, typer.Option(help="chaos_ledger (an agent) or chaos_graph (the same writes as a graph)")
                     ] = "chaos_ledger",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
) -> None:
    """Start a fleet in a private namespace, run goals with counted side effects, kill workers and restart
    the broker and the database meanwhile; print lost / duplicated / unexpected / recovered (exit 1 unless
    the first three are 0). It restarts the services it is pointed at: never run it against production."""

    from agentfleet.testing.chaos import Chaos, ChaosConfig

    logs.configure("WARNING", True)
    config = ChaosConfig(runs=runs, duration_s=duration, kills=kills, restart_broker=restarts,
                         restart_database=restarts, settle_s=settle, seed=seed, agent=agent)
    report = Chaos(get_settings(), config, cwd=Path.cwd()).run()
    if as_json:
        print(json.dumps(report.as_dict(), default=str))
    else:
        colour = "green" if report.ok else "red"
        out.print(f"[bold {colour}]lost {report.lost} · duplicated {report.duplicated} · unexpected "
                  f"{report.unexpected}[/] · recovered {report.recovered} · succeeded {report.succeeded} of "
                  f"{report.accepted} accepted ({report.runs} sent) in {report.elapsed_s:.0f}s")
        out.print(f"failed by code: {report.failed_by_code or '-'}; answered {report.answered}; side effects "
                  f"{report.side_effects}; UNKNOWN_OUTCOME in {report.unknown_outcomes} run(s); re-driven "
                  f"{report.redriven}")
        table = Table("at s", "fault", "target", "recovered in s", "note")
        for f in report.faults:
            table.add_row(f"{f.at_s:.1f}", f.kind, f.target, "-" if f.recovery_s is None else f"{f.recovery_s:.2f}",
                          f.note)
        (out if out.is_terminal else Console(width=200)).print(table)
        out.print(f"worker logs: {report.logs}")
    raise typer.Exit(0 if report.ok else 1)
