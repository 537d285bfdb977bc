"""What a leaner consumer for the fleet's own queues would buy, measured before choosing (issue 23, item 4).

Not a worker: an experiment. The fleet's roles run their real handlings (``run_event``: the same store, publisher,
hooks and tool dispatch as ``agentfleet worker``) on the same task messages, consumed not by Celery's worker but by
a kombu consumer with nothing else in the way: no hub, no strategy or ``Request``, no tracer, no remote control,
no events. Two ways:

* ``inline``: the handling runs on the consuming thread and the message is acked after it. The least any consumer
  can cost; it cannot run two handlings at once, which a real one must (a model answers in seconds).
* ``handoff``: the consuming thread hands the message to a handling thread and acks it when that thread says it is
  done (a pipe wakes the consuming thread; py-amqp is not for two threads). What a real lean consumer with a pool
  would at least cost.

Either acks a message once its handling returned or raised, as the fleet's Celery workers do (late acks, acked on
failure): a handling answers its own errors with a Result or a dead letter. The planner also takes goals off the
inbox (the worker's own ``Inbox``), not the unroutable queue: the bench sends nothing there.

Timed in turns with the fleet's own workers, with Celery + one commit a hop and with bare Celery (``bench
overhead``'s two floors), the same bench_loop agent, the same broker and database:
``python -m benchmarks.lean_consumer ROUNDS ITERATIONS``. Each consumer's ratio to both floors says whether any
consumer could bring the fleet within a bound on either. What it says is in benchmarks/README.md (issue 23, "A
leaner consumer, measured before choosing", and what came after it).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery._state import _task_stack
from kombu import Connection, Consumer, Message

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.events.topology import Topology
from agentfleet.roles.runtime import runtime_for
from agentfleet.store.db import scratch_database
from agentfleet.workers.app import create_app
from agentfleet.workers.event_task import EventTask, run_event
from agentfleet.workers.inbox import Inbox
from benchmarks.celery_floor import floor_workers
from benchmarks.common import BROKER, ONE_EACH, PG_ADMIN, ROOT, Fleet, fleet, wait_until
from benchmarks.suites.overhead import Side, loop_round, round_ratios

MODES = ("inline", "handoff")
# The floors each consumer's median is divided by, and the keys the ratios go under: every consumer over both,
# Celery + commit over bare Celery.
FLOOR_KEYS = {"celery + commit": "over_celery_commit", "bare celery": "over_bare_celery"}
FLOORS_UNDER = {"celery + commit": ("bare celery",), "bare celery": ()}


def _handle(app: Any, hostname: str, message: Message) -> None:
    """One task message through its role's real handling, with the request context a Celery worker would give it
    (the publisher links what it sends to it; the step reads its hostname and delivery info)."""
    args, kwargs, _embed = message.decode()
    task: EventTask = app.tasks[message.headers["task"]]
    task.push_request(
        id=message.headers["id"],
        root_id=message.headers.get("root_id"),
        parent_id=message.headers.get("parent_id"),
        retries=message.headers.get("retries", 0),
        hostname=hostname,
        delivery_info=message.delivery_info,
        kwargs=kwargs,
        args=args,
        called_directly=False,
        is_eager=False,
    )
    _task_stack.push(task)
    try:
        run_event(task, kwargs["envelope"], kwargs.get("carried"))
    finally:
        _task_stack.pop()
        task.pop_request()


def serve(role: str, mode: str) -> None:
    """Consume the role's queue until SIGTERM."""
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {MODES}, not {mode!r}")
    settings = Settings()
    app = create_app(settings)
    rt = runtime_for(app)
    hostname = f"{role}.lean@{socket.gethostname()}"
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    done: queue.SimpleQueue[Message] = queue.SimpleQueue()
    todo: queue.Queue[Message] = queue.Queue()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)

    def on_message(_body: Any, message: Message) -> None:
        if mode == "inline":
            try:
                _handle(app, hostname, message)
            finally:
                message.ack()
        else:
            todo.put(message)

    def handling_thread() -> None:
        while True:
            message = todo.get()
            try:
                _handle(app, hostname, message)
            finally:
                done.put(message)
                os.write(wake_w, b"x")

    if mode == "handoff":
        threading.Thread(target=handling_thread, daemon=True).start()
    with Connection(settings.broker_url) as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)
        consumers = [Consumer(channel, [rt.topology.role_queues[role]], callbacks=[on_message], accept=["json"])]
        if role == C.PLANNER:  # goals come in on the inbox, which a planner worker's bootstep consumes
            inbox = Inbox(rt)
            consumers.append(
                Consumer(
                    channel, [rt.topology.inbox_queue], on_message=inbox.on_goal, on_decode_error=inbox.on_undecodable
                )
            )
        for consumer in consumers:
            consumer.consume()
        sock = conn.connection.sock
        print("consuming", flush=True)
        while not stopping.is_set():
            readable, _, _ = select.select([sock, wake_r], [], [], 0.5)
            if wake_r in readable:
                os.read(wake_r, 4096)
                while True:
                    try:
                        done.get_nowait().ack()
                    except queue.Empty:
                        break
            if sock in readable:
                try:
                    while True:
                        conn.drain_events(timeout=0)
                except TimeoutError:
                    pass


@contextmanager
def lean_fleet(mode: str) -> Iterator[Fleet]:
    """A fleet (its own namespace and database) whose roles are lean consumers of ``mode``."""
    with fleet({}) as f:
        with Connection(BROKER) as conn:
            Topology(f.env["AGENTFLEET_NAMESPACE"]).declare(conn)
        env = {**os.environ, **f.env}
        procs = []
        for role in ONE_EACH:
            with (f.workers.logdir / f"{role}-lean.log").open("wb") as log:  # the child keeps its own copy
                proc = subprocess.Popen([sys.executable, "-m", "benchmarks.lean_consumer", "serve", role, mode],
                                        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            procs.append((f"{role}.lean", proc))
        f.workers.procs.extend(procs)  # so that ``pids(role)`` and ``stop`` see them
        wait_until(
            lambda: all("consuming" in (f.workers.logdir / f"{r}-lean.log").read_text() for r in ONE_EACH),
            "lean consumers",
            60,
        )
        yield f


def main(rounds: int, iterations: int) -> dict[str, Any]:
    sides = {"celery worker": Side(), "lean inline": Side(), "lean handoff": Side(), "celery + commit": Side(),
             "bare celery": Side()}
    with (
        scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url,
        fleet(ONE_EACH) as ours,
        lean_fleet("inline") as inline,
        lean_fleet("handoff") as handoff,
        floor_workers(commit_url=url) as floor,
        floor_workers() as bare,
    ):
        fleets = {"celery worker": ours, "lean inline": inline, "lean handoff": handoff}
        for f in fleets.values():
            f.run("bench_loop", {"iterations": 5})  # warm-up
        for _ in range(rounds):
            for name, f in fleets.items():
                loop_round(f, iterations, sides[name])
            sides["celery + commit"].rounds.append(floor.chain_ms(iterations))
            sides["bare celery"].rounds.append(bare.chain_ms(iterations))
    out: dict[str, Any] = {}
    for name, side in sides.items():
        med = statistics.median(side.samples)
        row: dict[str, Any] = {"median_ms": round(med, 2)}
        if side.cpu:
            row["worker_cpu_ms"] = side.cpu_per_iteration()
            row["switches"] = round(statistics.median(side.switches), 1)
        for floor_name in FLOORS_UNDER.get(name, tuple(FLOOR_KEYS)):
            key = FLOOR_KEYS[floor_name]
            ratios = round_ratios(side, sides[floor_name])
            row[key] = [round(r, 2) for r in ratios]
            row[f"{key}_median"] = round(statistics.median(ratios), 2)
        out[name] = row
    return out


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2])), indent=1))
