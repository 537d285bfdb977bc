"""The ``agentfleet`` Typer app and its sub-command groups; each command group is a module of this package that
adds its commands to these (Celery's ``celery/bin/`` layout)."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run LLM agents as a fleet of message-driven workers.")
ns_app = typer.Typer(no_args_is_help=True, help="Namespaces on the broker.")
app.add_typer(ns_app, name="namespace")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters: list, show, replay, purge.")
app.add_typer(dlq_app, name="dlq")
graph_app = typer.Typer(no_args_is_help=True, help="Graphs: show one, fork a run of one from a node.")
app.add_typer(graph_app, name="graph")
schedule_app = typer.Typer(no_args_is_help=True, help="Schedules: goals fired on cron expressions or intervals.")
app.add_typer(schedule_app, name="schedule")
