"""``agentfleet bench``: figures, side by side, on this machine. Not a test: nothing here asserts a speed.

Each suite starts what it measures (real worker processes over RabbitMQ, a scratch Postgres
database, a private broker namespace, peers in their own virtual environment) and tears it down.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.common import Report, Sizes, machine
from benchmarks.suites import (
    approvals,
    console,
    delegation,
    graphs,
    growth,
    in_flight,
    overhead,
    profile,
    recovery,
    retention,
    schedules,
    throughput,
)

SUITES: dict[str, Callable[[Sizes, Report], None]] = {
    "overhead": overhead.run,
    "throughput": throughput.run,
    "recovery": recovery.run,
    "growth": growth.run,
    "in_flight": in_flight.run,
    "delegation": delegation.run,
    "approvals": approvals.run,
    "profile": profile.run,
    "graphs": graphs.run,
    "retention": retention.run,
    "schedules": schedules.run,
    "console": console.run,
}


def run(suites: list[str], sizes: Sizes) -> Report:
    report = Report()
    report.figures["machine"] = machine()
    for name in suites:
        SUITES[name](sizes, report)
    return report


__all__ = ["SUITES", "Report", "Sizes", "run"]
