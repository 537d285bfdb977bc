"""An in-process fleet is something a program starts and stops (a test suite, a notebook, an app embedding a fleet):
stopped, it lets go of what it opened, or a process that runs several one after another runs out of them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from agentfleet.config.settings import get_settings
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import wait_for_run

pytestmark = pytest.mark.integration


def _scalar(url: str, sql: str, **params: Any) -> Any:
    """One value from the fleet's database, on a connection of its own (closed before returning)."""
    probe = create_engine(url)
    try:
        with probe.connect() as conn:
            return conn.execute(text(sql), params).scalar_one()
    finally:
        probe.dispose()


def _opened_since(url: str, since: datetime) -> int:
    """Sessions on the fleet's database opened since ``since``, the probe's own left out. Sessions opened before it
    are not the fleet's: under `make test` a module run earlier in this process may still be letting go of its own
    while this test counts, and a count of every session moved with them (2 before, 1 after)."""
    return int(_scalar(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND backend_start >= :since", since=since))


def test_a_stopped_fleet_lets_go_of_its_database_connections(distributed_env: dict[str, str]) -> None:
    url = get_settings().effective_database_url
    started = _scalar(url, "SELECT clock_timestamp()")
    for _ in range(3):
        with InProcessFleet(get_settings()) as fleet:
            run = wait_for_run(fleet.store, fleet.submit({"agent": "single", "input": {}}))
            assert run.result and run.result["status"] == "succeeded", run.result
            assert _opened_since(url, started) > 0
    assert _opened_since(url, started) == 0
