"""A namespace isolates everything, Celery's control plane and events included (issue 13)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from kombu import Connection

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.events.topology import Topology
from agentfleet.store import Store
from agentfleet.workers.app import create_app
from agentfleet.workers.processes import WorkerProcesses
from tests.conftest import BROKER_URL, REDIS_URL, ROOT, WorkerProcs
from tests.helpers import eventually, flower

pytestmark = pytest.mark.integration


def app_for(namespace: str):  # type: ignore[no-untyped-def]
    return create_app(Settings(broker_url=BROKER_URL, namespace=namespace))


def test_two_namespaces_on_one_broker_see_and_touch_only_their_own_workers(
        workers: WorkerProcs, namespace: str, tmp_path: Path, store: Store) -> None:
    other = f"aftest-{uuid.uuid4().hex[:8]}"
    theirs = WorkerProcesses({**workers.env, "AGENTFLEET_NAMESPACE": other}, tmp_path / "other-logs", cwd=ROOT)
    try:
        workers.start(C.EXECUTOR)
        theirs.start(C.EXECUTOR)
        workers.wait_ready()
        theirs.wait_ready()
        ours_app, their_app = app_for(namespace), app_for(other)
        mine = {n for r in ours_app.control.ping(timeout=2.0) for n in r}  # a broadcast, no destination
        seen_by_them = {n for r in their_app.control.ping(timeout=2.0) for n in r}
        assert mine == {workers.name(C.EXECUTOR, 0)}, mine
        assert seen_by_them == {theirs.name(C.EXECUTOR, 0)}, seen_by_them
        # A pool change broadcast in one namespace reaches only that namespace's workers.
        ours_app.control.pool_grow(1, reply=True, timeout=2.0)
        stats = {n: s["pool"]["max-concurrency"] for r in [their_app.control.inspect(timeout=2.0).stats() or {}]
                 for n, s in r.items()}
        assert stats == {theirs.name(C.EXECUTOR, 0): 8}, stats
        # Flower's view: the events of one namespace carry only its workers.
        events: list[dict] = []
        with ours_app.connection_for_read() as conn:
            receiver = ours_app.events.Receiver(conn, handlers={"*": events.append})
            with contextlib.suppress(TimeoutError):
                receiver.capture(limit=2, timeout=30, wakeup=True)  # heartbeats: one per 2 s
        assert events and {e["hostname"] for e in events} == {workers.name(C.EXECUTOR, 0)}, events[:3]

        def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                                  cwd=ROOT, env=env, timeout=120)

        # An operator's machine need not have the agents' code to see and scale the fleet.
        ops_env = {**workers.env, "AGENTFLEET_AGENTS": "tests.fixtures.no_such_module"}
        shown = cli(ops_env, "workers", "--json")
        assert shown.returncode == 0, shown.stderr[-2000:]
        listed = json.loads(shown.stdout)
        assert [w["name"] for w in listed["workers"]] == [workers.name(C.EXECUTOR, 0)]
        assert set(listed["queue_depths"]) == set(C.ROLES)
        scaled = cli(ops_env, "scale", "executor", "3", "--json")
        assert scaled.returncode == 0 and [r["after"] for r in json.loads(scaled.stdout)] == [3], scaled.stderr
        [kept] = [a for a in store.actions(limit=50) if a["action"] == "scale" and a["via"] == "cli"][:1]
        assert (kept["target"], kept["outcome"], kept["detail"]["total"]) == ("executor", "accepted", 3)
        listed = json.loads(cli(theirs.env, "workers", "--json").stdout)  # the other namespace: untouched
        assert [(w["name"], w["size"]) for w in listed["workers"]] == [(theirs.name(C.EXECUTOR, 0), 8)]

        with flower(workers.env, workers.logdir) as base:  # Flower in one namespace lists only its workers
            def flower_workers() -> Any:
                answer = httpx.get(f"{base}/api/workers", params={"refresh": "1"}, timeout=10)
                return answer.json() if answer.status_code == 200 and answer.json() else None

            assert set(eventually(flower_workers, timeout=60)) == {workers.name(C.EXECUTOR, 0)}
    finally:
        theirs.stop()
        with Connection(BROKER_URL) as conn:
            Topology(other).delete(conn)


def test_namespace_delete_removes_its_queues_exchanges_and_redis_keys() -> None:
    doomed = f"aftest-{uuid.uuid4().hex[:8]}"
    kept = f"aftest-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    with Connection(BROKER_URL) as conn:
        for ns in (doomed, kept):
            Topology(ns).declare(conn)
            client.set(f"{ns}:health:x", "1")
    try:
        refused = subprocess.run([sys.executable, "-m", "agentfleet.cli", "namespace", "delete", doomed],
                                 input="n\n", capture_output=True, text=True, cwd=ROOT, timeout=60,
                                 env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        assert refused.returncode == 1 and client.exists(f"{doomed}:health:x")  # asked, and told no
        done = subprocess.run([sys.executable, "-m", "agentfleet.cli", "namespace", "delete", doomed, "--yes"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr
        assert f"{doomed}.inbox" in done.stdout and "1 Redis keys" in done.stdout
        assert not client.exists(f"{doomed}:health:x") and client.exists(f"{kept}:health:x")
        with Connection(BROKER_URL) as conn:
            for queue in Topology(doomed).all_queues():
                with pytest.raises(Exception, match="NOT_FOUND"):
                    queue.bind(conn.channel()).queue_declare(passive=True)
            assert Topology(kept).inbox_queue.bind(conn.channel()).queue_declare(passive=True)
        bad = subprocess.run([sys.executable, "-m", "agentfleet.cli", "namespace", "delete", "no/such", "--yes"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    finally:
        with Connection(BROKER_URL) as conn:
            Topology(kept).delete(conn)
        client.delete(f"{kept}:health:x")
        client.close()
