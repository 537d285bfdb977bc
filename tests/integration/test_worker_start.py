"""A worker that cannot work says why and exits non-zero before it consumes anything (issue 13, fail fast)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import BROKER_URL, PG_ADMIN_URL, REDIS_URL, ROOT, require


def start_worker(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentfleet.cli", "worker", "planner"], env={**os.environ, **env},
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def unmigrated_database() -> Iterator[str]:
    """An empty Postgres database, as before anyone ran `agentfleet db upgrade`."""
    require("postgres")
    name = f"agentfleet_unmigrated_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def env_for(namespace: str, database_url: str, agents: str = "tests.fixtures.agents") -> dict[str, str]:
    return {"AGENTFLEET_PROFILE": "distributed", "AGENTFLEET_BROKER_URL": BROKER_URL, "AGENTFLEET_REDIS_URL": REDIS_URL,
            "AGENTFLEET_DATABASE_URL": database_url, "AGENTFLEET_NAMESPACE": namespace, "AGENTFLEET_AGENTS": agents,
            "PYTHONPATH": str(ROOT)}


def test_an_agents_module_that_cannot_be_imported_stops_the_worker_with_a_non_zero_exit(
        namespace: str, pg_url: str) -> None:
    done = start_worker(env_for(namespace, pg_url, agents="tests.fixtures.no_such_module"))
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests.fixtures.no_such_module" in done.stderr


def test_a_worker_refuses_a_database_whose_migrations_are_behind(namespace: str, unmigrated_database: str) -> None:
    done = start_worker(env_for(namespace, unmigrated_database))
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "agentfleet db upgrade" in done.stderr
