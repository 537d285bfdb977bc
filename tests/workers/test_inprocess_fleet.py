"""An in-process fleet is something a program starts and stops (a test suite, a notebook, an app embedding a fleet):
stopped, it lets go of what it opened, or a process that runs several one after another runs out of them."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from agentfleet.config.settings import get_settings
from agentfleet.workers.embedded import InProcessFleet
from tests.helpers import wait_for_run

pytestmark = pytest.mark.integration


def _connections(url: str) -> int:
    """Sessions open on the fleet's database, this one left out."""
    probe = create_engine(url)
    try:
        with probe.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND pid <> pg_backend_pid()")).scalar_one())
    finally:
        probe.dispose()


def test_a_stopped_fleet_lets_go_of_its_database_connections(distributed_env: dict[str, str]) -> None:
    url = get_settings().effective_database_url
    before = _connections(url)
    for _ in range(3):
        with InProcessFleet(get_settings()) as fleet:
            run = wait_for_run(fleet.store, fleet.submit({"agent": "single", "input": {}}))
            assert run.result and run.result["status"] == "succeeded", run.result
            assert _connections(url) > before
    assert _connections(url) == before
