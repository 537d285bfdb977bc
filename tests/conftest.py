"""Shared fixtures. Integration fixtures use the real services on localhost.

With CI set, a missing service fails the run; elsewhere it skips the tests that need it.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentfleet.store import Store, make_engine
from agentfleet.workers.processes import WorkerProcesses as WorkerProcs
from tests.fake_provider import word_stats_server  # noqa: F401 - a fixture for every test

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("AGENTFLEET_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
BROKER_URL = os.environ.get("AGENTFLEET_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("AGENTFLEET_TEST_REDIS", "redis://127.0.0.1:6379/0")
TEST_AGENTS = "agentfleet.examples.repo_report,tests.fixtures.agents"
SERVICES = {"rabbitmq": ("127.0.0.1", 5672), "postgres": ("127.0.0.1", 5432), "redis": ("127.0.0.1", 6379)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Chaos tests first, in the order found, then the other integration tests, then the rest. Chaos tests restart
    RabbitMQ and Postgres, which leaves the connections this process pooled before dead (kombu's pool is
    process-wide), and they are the slowest. Integration tests before unit tests because `make test` hands out
    modules two at a time in this order: the slow fleets first, and the quick units fill in at the end, where a
    slow fleet module would leave one process working alone."""
    items.sort(key=lambda item: (item.get_closest_marker("chaos") is None,
                                 item.get_closest_marker("integration") is None))


@pytest.fixture(autouse=True)
def _by_itself(request: pytest.FixtureRequest) -> None:
    """Under pytest-xdist (``-n``) another process runs tests beside this one: a chaos test would restart RabbitMQ,
    Postgres or Redis beneath its tests, and an alone test would count its CPU as this one's. Such a test fails
    before its body runs, saying how to run it; never skipped. `make test` runs them first, by themselves."""
    node = request.node
    if os.environ.get("PYTEST_XDIST_WORKER") and (node.get_closest_marker("chaos") or node.get_closest_marker("alone")):
        pytest.fail("chaos and alone tests run by themselves, never beside another process: run them without -n, "
                    "as make test does (-m \"chaos or alone\")", pytrace=False)


@pytest.fixture(autouse=True)
def _fresh_broker_connections_after_chaos(request: pytest.FixtureRequest) -> Iterator[None]:
    """A chaos test restarts RabbitMQ: every connection kombu pooled in this process before it is dead, and the
    pool would hand one out to the next test. Dropped after each chaos test."""
    yield
    if request.node.get_closest_marker("chaos") is not None:
        import kombu.pools

        kombu.pools.reset()


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require(*names: str) -> None:
    missing = [n for n in names if not _reachable(*SERVICES[n])]
    if missing:
        message = f"services not reachable on localhost: {', '.join(missing)} (run .ci/services)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's AGENTFLEET_* variables; each gets its own workspace."""
    for key in list(os.environ):
        if key.startswith("AGENTFLEET_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AGENTFLEET_AGENTS", TEST_AGENTS)
    monkeypatch.setenv("AGENTFLEET_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("AGENTFLEET_EMBEDDED_DATABASE_URL", f"sqlite:///{tmp_path}/embedded.db")
    from agentfleet.config.settings import get_settings

    get_settings.cache_clear()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database for the session, migrated to head, dropped afterwards."""
    require("postgres")
    from agentfleet.store.db import scratch_database

    with scratch_database(PG_ADMIN_URL, prefix="agentfleet_test") as url:
        yield url


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    """The session database's store, as the workers see it."""
    engine = make_engine(pg_url)
    yield Store(engine)
    engine.dispose()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A private set of exchanges and queues on the real broker, deleted afterwards."""
    require("rabbitmq")
    from kombu import Connection

    from agentfleet.events.topology import Topology

    ns = f"aftest-{uuid.uuid4().hex[:8]}"
    yield ns
    from agentfleet.agents.registry import fleet_agents
    from agentfleet.config.settings import get_settings

    with Connection(BROKER_URL) as conn:  # the test agents' dedicated tool queues too
        Topology(ns, tool_queues=fleet_agents(get_settings()).tool_queues()).delete(conn)
    if _reachable(*SERVICES["redis"]):  # the namespace's health entries, breakers, cache and locks
        import redis

        from agentfleet.fleet.fleet_redis import forget_namespace

        client = redis.Redis.from_url(REDIS_URL)
        forget_namespace(client, ns)
        client.close()


@pytest.fixture
def fleet_redis(namespace: str) -> Iterator[Any]:
    """The real Redis the test's fleet uses (its keys are under the namespace)."""
    require("redis")
    import redis

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def fleet_seal(fleet_redis: Any, store: Store, namespace: str) -> Any:
    """The fleet's Redis as its workers see it (their key, from the session database): to write entries the
    fleet believes, and to read them back."""
    from agentfleet import constants as C
    from agentfleet.fleet.fleet_redis import FleetRedis

    return FleetRedis(fleet_redis, namespace, secret=store.fleet_secret(C.FLEET_KEY_SECRET).encode())


@pytest.fixture
def distributed_env(namespace: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment of a distributed fleet in this test's namespace (also applied to this process)."""
    env = {
        "AGENTFLEET_PROFILE": "distributed",
        "AGENTFLEET_BROKER_URL": BROKER_URL,
        "AGENTFLEET_REDIS_URL": REDIS_URL,
        "AGENTFLEET_DATABASE_URL": pg_url,
        "AGENTFLEET_NAMESPACE": namespace,
        "AGENTFLEET_AGENTS": TEST_AGENTS,
        "AGENTFLEET_WORKSPACE": str(tmp_path),
        "AGENTFLEET_LOG_LEVEL": "INFO",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from agentfleet.config.settings import get_settings

    get_settings.cache_clear()
    return env


@pytest.fixture
def workers(distributed_env: dict[str, str], tmp_path: Path) -> Iterator[WorkerProcs]:
    procs = WorkerProcs({**distributed_env, "PYTHONPATH": str(ROOT)}, tmp_path / "logs", cwd=ROOT)
    yield procs
    procs.stop()
