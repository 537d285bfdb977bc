"""A worker that cannot work says why and exits non-zero before it consumes anything (issue 13, fail fast)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from agentfleet import constants as C
from tests.conftest import BROKER_URL, PG_ADMIN_URL, REDIS_URL, ROOT, require

pytestmark = pytest.mark.integration


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


UNREACHABLE = {  # loopback port 1: nothing listens, so every connect is refused at once
    "AGENTFLEET_BROKER_URL": "amqp://guest:canary-broker-pw@127.0.0.1:1//",
    "AGENTFLEET_DATABASE_URL": "postgresql+psycopg://postgres:canary-db-pw@127.0.0.1:1/postgres",
    "AGENTFLEET_REDIS_URL": "redis://:canary-redis-pw@127.0.0.1:1/0",
}


@pytest.mark.parametrize("setting", list(UNREACHABLE))
def test_a_service_that_cannot_be_reached_stops_the_worker_naming_the_setting(
        setting: str, namespace: str, pg_url: str) -> None:
    """Tried for AGENTFLEET_CONNECT_TIMEOUT_S, then exit 69 with the setting and its URL, password masked."""
    env = {**env_for(namespace, pg_url), setting: UNREACHABLE[setting], "AGENTFLEET_CONNECT_TIMEOUT_S": "1"}
    done = start_worker(env, timeout=45)
    said = done.stdout + done.stderr
    assert done.returncode == C.EXIT_UNREACHABLE, said[-3000:]
    assert setting in done.stderr and "127.0.0.1:1" in done.stderr, said[-3000:]
    assert "canary-" not in said  # the password never reaches a log line or the error
    assert "retrying" in said  # it tried more than once before giving up


def test_sigterm_stops_a_worker_that_is_still_trying_to_reach_the_broker(namespace: str, pg_url: str) -> None:
    env = {**os.environ, **env_for(namespace, pg_url), "AGENTFLEET_BROKER_URL": UNREACHABLE["AGENTFLEET_BROKER_URL"],
           "AGENTFLEET_CONNECT_TIMEOUT_S": "600"}
    proc = subprocess.Popen([sys.executable, "-m", "agentfleet.cli", "worker", "executor"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # it says so while it tries
            if "retrying" in line:
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode != 0


def test_the_plain_celery_command_refuses_a_database_whose_migrations_are_behind(
        namespace: str, unmigrated_database: str) -> None:
    """`celery -A agentfleet.workers.app worker` makes the same checks as `agentfleet worker`."""
    env = {**os.environ, **env_for(namespace, unmigrated_database)}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "agentfleet.workers.app", "worker", "-P", "threads",
                           "-Q", f"{namespace}.planner", "--without-mingle", "--without-gossip"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "agentfleet db upgrade" in done.stdout + done.stderr


def test_submit_that_cannot_reach_the_broker_names_the_setting(namespace: str, pg_url: str) -> None:
    env = {**os.environ, **env_for(namespace, pg_url),
           "AGENTFLEET_BROKER_URL": UNREACHABLE["AGENTFLEET_BROKER_URL"], "AGENTFLEET_CONNECT_TIMEOUT_S": "1"}
    done = subprocess.run([sys.executable, "-m", "agentfleet.cli", "submit", "ledger"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == C.EXIT_UNREACHABLE, done.stdout[-2000:] + done.stderr[-2000:]
    assert "AGENTFLEET_BROKER_URL" in done.stderr and "Traceback" not in done.stderr
    assert "canary-" not in done.stdout + done.stderr


def test_a_cli_command_that_cannot_reach_the_database_names_the_setting(namespace: str, pg_url: str) -> None:
    env = {**os.environ, **env_for(namespace, pg_url),
           "AGENTFLEET_DATABASE_URL": UNREACHABLE["AGENTFLEET_DATABASE_URL"], "AGENTFLEET_CONNECT_TIMEOUT_S": "1"}
    done = subprocess.run([sys.executable, "-m", "agentfleet.cli", "status", "0" * 32], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == C.EXIT_UNREACHABLE, done.stdout[-2000:] + done.stderr[-2000:]
    assert "AGENTFLEET_DATABASE_URL" in done.stderr and "Traceback" not in done.stderr
    assert "canary-" not in done.stdout + done.stderr


def test_an_invalid_agent_declaration_stops_the_worker_before_it_consumes(namespace: str, pg_url: str) -> None:
    done = start_worker(env_for(namespace, pg_url, agents="tests.fixtures.bad_agents"))
    assert done.returncode == C.EXIT_CONFIGURATION, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no_such_tool" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_model_whose_key_is_missing_stops_the_worker_naming_the_variable(namespace: str, pg_url: str) -> None:
    env = {**env_for(namespace, pg_url), "ANTHROPIC_API_KEY": "",
           "AGENTFLEET_MODELS": json.dumps({"wired": "anthropic:claude-haiku-4-5"})}
    done = start_worker(env)
    assert done.returncode == C.EXIT_CONFIGURATION, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ANTHROPIC_API_KEY" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_plugin_that_cannot_load_stops_the_worker_naming_the_plugin(namespace: str, pg_url: str) -> None:
    env = {**env_for(namespace, pg_url), "AGENTFLEET_PLUGIN_PATHS": str(ROOT / "examples" / "plugins"),
           "AGENTFLEET_PLUGINS_DISABLED": "wordsmith"}
    done = start_worker(env)
    assert done.returncode == C.EXIT_CONFIGURATION, done.stdout[-2000:] + done.stderr[-2000:]
    said = " ".join(done.stderr.split())
    assert "plugin 'shouter' requires 'wordsmith', which is disabled" in said and "Traceback" not in said, said[-2000:]
