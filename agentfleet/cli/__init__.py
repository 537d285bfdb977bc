"""The ``agentfleet`` command: one module per command group, parsing and printing only; what the commands do
is the operator API's (``agentfleet.ops``) and the fleet's."""

# Each group adds its commands when imported: this order is the order `agentfleet --help` lists them in.
# isort: off
from agentfleet.cli import goals, runs, threads, approvals, workers, catalog, bench, dlq, admin  # noqa: F401
from agentfleet.cli import lineage, graphs, schedules, retention, console  # noqa: F401
# isort: on
from agentfleet.cli.app import app
from agentfleet.cli.main import main

__all__ = ["app", "main"]
