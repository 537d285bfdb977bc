"""Small helpers for tests: wait for a run, read the store, talk plain AMQP."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import text

from agentfleet.config.settings import get_settings
from agentfleet.ops.progress import wait_for_end
from agentfleet.store.base import lock_id
from agentfleet.store.records import RunRecord
from agentfleet.store.repository import Store
from agentfleet.workers.embedded import EmbeddedFleet

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def step_held(store: Store, key: str) -> Iterator[None]:
    """Hold a step's advisory lock from here, as a SIGKILLed worker's session does until Postgres closes it."""
    with store.engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock_id(key)})
        holder.commit()
        try:
            yield
        finally:
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_id(key)})
            holder.commit()


def appears(workspace: Path, pattern: str, timeout: float = 30.0) -> Path:
    """The first file in ``workspace`` matching ``pattern``, once one is there: what a fixture agent or tool notes
    as it reaches a point the test waits for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marker = next(iter(workspace.glob(pattern)), None)
        if marker is not None:
            return marker
        time.sleep(0.02)
    raise TimeoutError(f"no {pattern} in {workspace} within {timeout}s")


def tool_started(workspace: Path, timeout: float = 30.0) -> Path:
    """The marker ``slow_append`` writes as it enters its call: from then on the call is in flight."""
    return appears(workspace, "started-*.txt", timeout)


@contextmanager
def embedded_fleet(workspace: Path, agents: str, **env: str) -> Iterator[EmbeddedFleet]:
    """An embedded fleet loading ``agents``, its SQLite database and workspace in ``workspace`` (``AGENTFLEET_*``
    variables in ``env`` too); ``.workspace`` on it says where."""
    mp = pytest.MonkeyPatch()
    for key, value in {"AGENTFLEET_AGENTS": agents, "AGENTFLEET_WORKSPACE": str(workspace),
                       "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{workspace}/fleet.db", **env}.items():
        mp.setenv(key, value)
    get_settings.cache_clear()
    try:
        with EmbeddedFleet(get_settings()) as running:
            running.workspace = workspace  # type: ignore[attr-defined]
            yield running
    finally:
        mp.undo()
        get_settings.cache_clear()


def wait_for_run(store: Store, run_id: str, timeout: float = 60.0) -> RunRecord:
    run = wait_for_end(store, run_id, timeout_s=timeout)
    if run is None:
        raise TimeoutError(f"run {run_id} did not end in {timeout}s: {store.get_run(run_id)}")
    return run


class AmqpClient:
    """A plain pika client: what a non-Python program would do."""

    def __init__(self, url: str = "amqp://guest:guest@127.0.0.1:5672/%2F") -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.reply_queue = self.channel.queue_declare(queue="", exclusive=True).method.queue

    def publish_goal(self, namespace: str, routing_key: str, body: bytes | dict[str, Any],
                     correlation_id: str | None = None, **properties: Any) -> str:
        """Publish to the inbox (a goal, or any plain-JSON message) with a reply address; the correlation id."""
        correlation_id = correlation_id or uuid.uuid4().hex
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.channel.basic_publish(
            exchange=f"{namespace}.inbox", routing_key=routing_key, body=data,
            properties=pika.BasicProperties(content_type="application/json", reply_to=self.reply_queue,
                                            correlation_id=correlation_id, delivery_mode=2, **properties),
        )
        return correlation_id

    def replies(self, count: int, timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        """Wait for ``count`` replies; returns them by correlation id."""
        got: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            method, props, body = self.channel.basic_get(self.reply_queue, auto_ack=True)
            if method is None:
                self.connection.sleep(0.05)
                continue
            got[props.correlation_id] = json.loads(body)
        return got

    def drain(self, queue: str, expected: int, timeout: float = 20.0) -> list[tuple[Any, bytes]]:
        """Take ``expected`` messages off a queue (or what arrived by the timeout)."""
        out: list[tuple[Any, bytes]] = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            method, props, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                self.connection.sleep(0.05)
                continue
            out.append((props, body))
        return out

    def subscribe_public(self, namespace: str, routing_key: str) -> str:
        """A private queue bound to ``<ns>.public`` (declared here: a dashboard may start before the fleet)."""
        exchange = f"{namespace}.public"
        self.channel.exchange_declare(exchange, "topic", durable=True)
        queue = self.channel.queue_declare(queue="", exclusive=True).method.queue
        self.channel.queue_bind(queue, exchange, routing_key=routing_key)
        return queue

    def close(self) -> None:
        self.connection.close()


class RedisOutage:
    def __init__(self, host: str = "127.0.0.1", port: int = 6379) -> None:
        self.address = (host, port)

    def up(self) -> bool:
        try:
            with socket.create_connection(self.address, timeout=1):
                return True
        except OSError:
            return False

    def wait_down(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.up():
            if time.monotonic() > deadline:
                raise TimeoutError("Redis did not stop")
            time.sleep(0.05)


@contextmanager
def redis_restarted() -> Iterator[RedisOutage]:
    """Redis stopped for the block (``redis-cli shutdown nosave``), then started again as CI starts it."""
    outage = RedisOutage()
    subprocess.run(["redis-cli", "-h", outage.address[0], "-p", str(outage.address[1]), "shutdown", "nosave"],
                   capture_output=True, timeout=30)
    try:
        yield outage
    finally:
        subprocess.run(["bash", str(ROOT / ".ci" / "services")], capture_output=True, timeout=180)
        deadline = time.monotonic() + 60
        while not outage.up() and time.monotonic() < deadline:
            time.sleep(0.1)


def eventually(what: Callable[[], Any], timeout: float = 30.0, message: str = "") -> Any:
    """``what()`` once it is truthy, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout}s: {message}")


def free_port() -> int:
    """A loopback port nothing listens on now (for a worker's metrics or Flower)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def flower(env: dict[str, str], logdir: Path) -> Iterator[str]:
    """`agentfleet flower` with its API open, started with ``env``; yields its base URL once it answers."""
    import sys

    import httpx

    from tests.conftest import ROOT

    port = free_port()
    log = (logdir / f"flower-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentfleet.cli", "flower", "--port", str(port), "--unauthenticated-api"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthcheck", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise TimeoutError(f"flower did not start: {(logdir / f'flower-{port}.log').read_text()}")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line holds ``marker`` (zombies and this process excluded)."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def require_sandbox() -> None:
    """Fail (under CI) or skip where bubblewrap cannot build a sandbox: ``make test`` installs it."""
    import os

    from agentfleet.sandbox.bwrap import support

    found = support(refresh=True)
    if not found.available:
        if os.environ.get("CI"):
            pytest.fail(f"the sandbox is needed: {found.detail}")
        pytest.skip(found.detail)


def call_ctx(workspace: Path, call_id: str = "c") -> Any:
    """A tool call's context, as the executor would give it."""
    from agentfleet import ToolContext

    return ToolContext(run_id="r", call_id=call_id, idempotency_key=f"k-{call_id}", workspace=workspace.resolve())


class RoundTrips(dict[str, int]):
    """Round trips by event id (``count_round_trips``), and the handlings counted that have not ended yet; ``sent``:
    each round trip's statements, in order, by event id."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.ended = 0
        self.changed = threading.Condition()
        self.sent: dict[str, list[list[str]]] = {}

    def settled(self, timeout: float = 20.0, *, handlings: int = 0) -> dict[str, int]:
        """The counts once no counted handling is still running, and at least ``handlings`` have ended. A run's
        result is seen as its last handling commits, and that handling may make a round trip after the COMMIT (a step
        lock let go): read before it ends, the count would be one short. A handling after the run's end (the
        observer's of ``run.completed``) may not have begun yet: ``handlings`` waits for it."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.running == 0 and self.ended >= handlings, timeout):
                raise AssertionError(f"{self.running} handling(s) still running, {self.ended} of {handlings} ended, "
                                     f"after {timeout}s")
            return dict(self)


def count_round_trips(monkeypatch: pytest.MonkeyPatch, role: str, *event_types: str) -> RoundTrips:
    """Round trips to Postgres made in each handling by ``role`` of an event of these types, by the event's id (filled
    in as the handlings run; read them with ``settled``)."""
    from agentfleet.hooks.base import Hooks, current_step
    from agentfleet.store import sql

    counted = RoundTrips()
    round_trip, step = sql._round_trip, Hooks.step

    def counting(conn: Any, dbapi: Any, statements: Any, rows: bool) -> Any:
        current = current_step()
        if current is not None and current.role == role and current.event_type in event_types:
            with counted.changed:
                counted[current.event_id] = counted.get(current.event_id, 0) + 1
                counted.sent.setdefault(current.event_id, []).append([" ".join(str(s[0]).split())
                                                                      for s in statements])
        return round_trip(conn, dbapi, statements, rows)

    @contextmanager
    def watched(self: Hooks, info: Any) -> Iterator[Any]:
        mine = info.role == role and info.event_type in event_types
        if mine:
            with counted.changed:
                counted.running += 1
        try:
            with step(self, info) as watch:
                yield watch
        finally:
            if mine:
                with counted.changed:
                    counted.running -= 1
                    counted.ended += 1
                    counted.changed.notify_all()

    monkeypatch.setattr(sql, "_round_trip", counting)
    monkeypatch.setattr(Hooks, "step", watched)
    return counted
