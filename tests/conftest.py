"""Shared fixtures. Integration fixtures use the real services on localhost.

With CI set, a missing service fails the run; elsewhere it skips the tests that need it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("AGENTFLEET_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
BROKER_URL = os.environ.get("AGENTFLEET_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
TEST_AGENTS = "agentfleet.examples.repo_report,tests.fixtures.agents"
SERVICES = {"rabbitmq": ("127.0.0.1", 5672), "postgres": ("127.0.0.1", 5432), "redis": ("127.0.0.1", 6379)}


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
    from sqlalchemy import create_engine, text

    from agentfleet.store import db

    name = f"agentfleet_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    db.upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A private set of exchanges and queues on the real broker, deleted afterwards."""
    require("rabbitmq")
    from kombu import Connection

    from agentfleet.events.topology import Topology

    ns = f"aftest-{uuid.uuid4().hex[:8]}"
    yield ns
    with Connection(BROKER_URL) as conn:
        Topology(ns).delete(conn)


@pytest.fixture
def distributed_env(namespace: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment of a distributed fleet in this test's namespace (also applied to this process)."""
    env = {
        "AGENTFLEET_PROFILE": "distributed",
        "AGENTFLEET_BROKER_URL": BROKER_URL,
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


class WorkerProcs:
    """Real `agentfleet worker ROLE` subprocesses; stopped (killed) at teardown."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def name(self, role: str, index: int) -> str:
        """Node names are unique per namespace: a node's remote-control queue is exclusive on the broker."""
        return f"{role}.{index}@{self.env['AGENTFLEET_NAMESPACE']}"

    def start(self, role: str, *extra: str) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        log = (self.logdir / f"{role}-{index}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentfleet.cli", "worker", role, "--hostname", self.name(role, index), *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        self.procs.append((self.name(role, index), proc))
        return proc

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every started worker answers a ping over the broker."""
        from agentfleet.config.settings import Settings
        from agentfleet.workers.app import create_app

        app = create_app(Settings(broker_url=self.env["AGENTFLEET_BROKER_URL"],
                                  namespace=self.env["AGENTFLEET_NAMESPACE"]))
        wanted = {name for name, proc in self.procs if proc.poll() is None}
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            replies = app.control.ping(destination=list(wanted), timeout=1.0) or []
            seen = {name for reply in replies for name in reply}
            if wanted <= seen:
                return
            dead = [n for n, p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"workers exited: {dead}; logs in {self.logdir}")
        raise TimeoutError(f"workers not ready: {wanted - seen}; logs in {self.logdir}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.logdir.glob("*.log")))

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(distributed_env: dict[str, str], tmp_path: Path) -> Iterator[WorkerProcs]:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    procs = WorkerProcs(distributed_env, logdir)
    yield procs
    procs.stop()
