"""A chaos run: a real fleet, goals with counted side effects, and faults while they run.

Two worker processes per role (one on the thread pool, one on prefork) run ``chaos_ledger``
goals, whose tool appends to a table with no unique constraint. Meanwhile workers of every
role are SIGKILLed (half of the kills aimed at an executor in the middle of a tool call,
found through the steps table), RabbitMQ is restarted once and Postgres once (immediate).
Then it counts as RabbitMQ's own Jepsen test does:

* lost — a goal the broker confirmed whose run never ended;
* duplicated — a non-idempotent call whose side effect ran more than once;
* unexpected — a Result for no goal that was sent;
* recovered — a run that ended after an UNKNOWN_OUTCOME, a retried step or a re-drive;

and, per fault, how long until every run that was live when it struck had moved again.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kombu import Connection, Consumer, Exchange, Queue
from sqlalchemy import Engine, func, select

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.events.topology import Topology
from agentfleet.loop.keys import run_id_for
from agentfleet.loop.states import TERMINAL
from agentfleet.store import db
from agentfleet.store import tables as T
from agentfleet.testing.chaos_ledger import ledger, ledger_engine
from agentfleet.workers.processes import WorkerProcesses

log = logging.getLogger(__name__)
AGENT = "chaos_ledger"
AGENTS_MODULE = "agentfleet.testing.chaos_ledger"
KILL_ORDER = (C.PLANNER, C.OBSERVER, C.EXECUTOR)  # aimed kills hit executors already
POOLS: tuple[tuple[str, ...], ...] = ((), ("--pool", "prefork", "--concurrency", "2"))


@dataclass
class Fault:
    kind: str  # kill-mid-call | kill | broker-restart | database-restart
    target: str
    at_s: float
    recovery_s: float | None = None  # until every run live at the fault moved again (None: not within the run)
    note: str = ""


@dataclass
class ChaosReport:
    namespace: str
    runs: int
    accepted: int = 0
    ended: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    recovered: int = 0
    succeeded: int = 0
    failed_by_code: dict[str, int] = field(default_factory=dict)
    answered: int = 0
    side_effects: int = 0
    unknown_outcomes: int = 0
    redriven: int = 0
    faults: list[Fault] = field(default_factory=list)
    elapsed_s: float = 0.0
    logs: str = ""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class ChaosConfig:
    runs: int = 300
    duration_s: float = 120.0
    kills: int | None = None  # default: one every 10 s of the duration, at least 4
    restart_broker: bool = True
    restart_database: bool = True
    settle_s: float = 300.0  # after the faults, how long runs may take to end before the rest count as lost
    tool_delay_s: float = 0.4
    seed: int | None = None
    agent: str = AGENT  # or "chaos_graph": the same counted writes as a graph's nodes
    logdir: Path = Path(".agentfleet/chaos")


class Chaos:
    def __init__(self, settings: Settings, config: ChaosConfig, *, cwd: Path | None = None) -> None:
        self.config = config
        self.namespace = f"{settings.namespace}-chaos-{uuid.uuid4().hex[:6]}"
        self.settings = settings.model_copy(update={"namespace": self.namespace})
        self.rng = random.Random(config.seed)
        self.topology = Topology(self.namespace)
        self.report = ChaosReport(self.namespace, config.runs)
        agents = ",".join(dict.fromkeys([*settings.agent_modules, AGENTS_MODULE]))
        self.workers = WorkerProcesses({
            "AGENTFLEET_PROFILE": "distributed", "AGENTFLEET_BROKER_URL": settings.broker_url,
            "AGENTFLEET_DATABASE_URL": settings.database_url, "AGENTFLEET_NAMESPACE": self.namespace,
            "AGENTFLEET_AGENTS": agents, "AGENTFLEET_STALL_AFTER_S": "10", "AGENTFLEET_SWEEP_INTERVAL_S": "2",
            "AGENTFLEET_LOG_LEVEL": "INFO",
        }, config.logdir / self.namespace, cwd=cwd)
        self.extra_args: dict[str, tuple[str, tuple[str, ...]]] = {}  # worker name -> (role, args), to restart alike
        self.sent: dict[str, str] = {}  # correlation id -> goal id
        self.accepted: set[str] = set()  # goal ids the broker confirmed
        self.replies: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._kills = 0
        self._monitors: list[threading.Thread] = []
        self.started = 0.0
        self.engine: Engine = ledger_engine(settings.database_url)

    # -- the run -----------------------------------------------------------------------

    def run(self) -> ChaosReport:
        db.upgrade(self.settings.database_url)
        self.started = time.monotonic()
        with Connection(self.settings.broker_url) as conn:
            conn.ensure_connection(max_retries=5)
            self.topology.declare(conn)
            self.reply_queue(conn).declare()
        try:
            for role in C.ROLES:
                for args in POOLS:
                    self._start(role, args)
            self.workers.wait_ready(timeout=90)
            threads = [threading.Thread(target=self._collect_replies, daemon=True),
                       threading.Thread(target=self._submit, daemon=True)]
            for t in threads:
                t.start()
            self._faults()
            self._settle()
            self._stop.set()
            for t in threads:
                t.join(timeout=15)
            self._count()
        finally:
            self.report.elapsed_s = round(time.monotonic() - self.started, 1)
            self.report.logs = str(self.workers.logdir)
            self.workers.stop()
            self._delete_topology()
        return self.report

    def reply_queue(self, conn: Connection) -> Queue:
        return Queue(f"{self.namespace}.chaos.replies", exchange=Exchange(""), durable=True, channel=conn)

    def _start(self, role: str, args: tuple[str, ...]) -> str:
        self.workers.start(role, *args)
        name = self.workers.procs[-1][0]
        self.extra_args[name] = (role, args)
        return name

    def _run_ids(self) -> list[str]:
        return [run_id_for(self.config.agent, g) for g in self.accepted]

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 2)

    # -- goals in, Results out ----------------------------------------------------------

    def _submit(self) -> None:
        """Publish every goal (confirmed, retried through broker outages) across the faults, so each meets work."""
        spacing = self.config.duration_s * 0.9 / max(1, self.config.runs)
        inbox = self.topology.inbox
        with Connection(self.settings.broker_url, transport_options={"confirm_publish": True}) as conn:
            producer = conn.Producer()
            publish = conn.ensure(producer, producer.publish, max_retries=60, interval_start=0.5,
                                  interval_step=0.5, interval_max=2)
            for i in range(self.config.runs):
                goal_id = f"{self.namespace}-{i}"
                correlation_id = uuid.uuid4().hex
                self.sent[correlation_id] = goal_id
                agent = self.config.agent
                body = {"agent": agent, "goal_id": goal_id, "input": {"n": i, "delay_s": self.config.tool_delay_s}}
                try:
                    publish(json.dumps(body), exchange=inbox, routing_key=f"{C.GOAL_ROUTING_PREFIX}{agent}",
                            content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                            reply_to=f"{self.namespace}.chaos.replies", correlation_id=correlation_id)
                    self.accepted.add(goal_id)
                except Exception as exc:  # never confirmed: not accepted, so not counted as lost
                    log.warning("goal %s not confirmed: %s", goal_id, exc)
                time.sleep(spacing)

    def _collect_replies(self) -> None:
        """Results on a durable reply queue, read through broker restarts."""
        while not self._stop.is_set():
            try:
                with Connection(self.settings.broker_url) as conn:
                    conn.ensure_connection(max_retries=30, interval_start=0.5, interval_step=0.5, interval_max=2)

                    def on_message(body: Any, message: Any) -> None:
                        self.replies.append({"correlation_id": message.properties.get("correlation_id"),
                                             **(json.loads(body) if isinstance(body, str | bytes) else body)})
                        message.ack()

                    with Consumer(conn, queues=[self.reply_queue(conn)], callbacks=[on_message], accept=["json"]):
                        while not self._stop.is_set():
                            try:
                                conn.drain_events(timeout=0.5)
                            except TimeoutError:
                                continue
            except Exception as exc:
                log.info("reply consumer reconnecting: %s", exc)
                time.sleep(0.5)

    # -- faults ---------------------------------------------------------------------------

    def _faults(self) -> None:
        cfg = self.config
        kills = cfg.kills if cfg.kills is not None else max(4, int(cfg.duration_s // 10))
        plan: list[tuple[float, str]] = [(cfg.duration_s * (i + 1) / (kills + 1), "kill-mid-call" if i % 2 == 0
                                          else "kill") for i in range(kills)]
        if cfg.restart_broker:
            plan.append((cfg.duration_s * 0.35, "broker-restart"))
        if cfg.restart_database:
            plan.append((cfg.duration_s * 0.65, "database-restart"))
        for at, kind in sorted(plan):
            time.sleep(max(0.0, at - (time.monotonic() - self.started)))
            began = time.monotonic()
            fault = self._strike(kind)
            self.report.faults.append(fault)
            over = datetime.now(UTC)  # activity counts once the fault is over (a restart done, a worker dead)
            monitor = threading.Thread(target=self._measure_recovery, args=(fault, over, began), daemon=True)
            monitor.start()
            self._monitors.append(monitor)
        time.sleep(max(0.0, cfg.duration_s - (time.monotonic() - self.started)))

    def _strike(self, kind: str) -> Fault:
        at = self._elapsed()
        if kind == "broker-restart":
            return Fault(kind, "rabbitmq", at, note=self._restart(_broker_restart()))
        if kind == "database-restart":
            return Fault(kind, "postgres", at, note=self._restart(_database_restart()))
        victim = self._in_a_call() if kind == "kill-mid-call" else None
        if victim is None:  # plain kills take each role in turn
            role = KILL_ORDER[self._kills % len(KILL_ORDER)]
            self._kills += 1
            live = [n for n, p in self.workers.procs if p.poll() is None and self.extra_args[n][0] == role]
            victim = self.rng.choice(live)
            kind = "kill" if kind == "kill" else "kill (no call in flight to aim at)"
        self.workers.kill(victim)
        role, args = self.extra_args[victim]
        replacement = self._start(role, args)
        return Fault(kind, victim, at, note=f"replaced by {replacement}")

    def _in_a_call(self) -> str | None:
        """An executor in the middle of a tool call right now, from the steps table."""
        live = {n for n, p in self.workers.procs if p.poll() is None}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                with self.engine.connect() as conn:
                    holders = conn.execute(select(T.steps.c.worker).where(
                        T.steps.c.kind == "tool", T.steps.c.status == "started",
                        T.steps.c.run_id.in_(self._run_ids()))).scalars().all()
            except Exception:
                holders = []
            candidates = sorted({h for h in holders if h in live})
            if candidates:
                time.sleep(self.config.tool_delay_s / 4)  # into the call, not at its first instant
                return self.rng.choice(candidates)
            time.sleep(0.05)
        return None

    def _restart(self, command: list[list[str]] | None) -> str:
        if command is None:
            return "skipped: no rabbitmqctl / pg_ctlcluster on this machine"
        began = time.monotonic()
        for argv in command:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
            if done.returncode != 0:
                return f"{' '.join(argv)} failed: {done.stderr.strip()[:200]}"
        return f"restarted (down {time.monotonic() - began:.1f}s)"

    def _measure_recovery(self, fault: Fault, struck: datetime, started: float) -> None:
        """Seconds from the fault's start (a restart's outage included) until every run live when it was over
        (``struck``) has shown activity since, or ended."""
        terminal = [s.value for s in TERMINAL]
        ids: list[str] | None = None
        limit = self.config.duration_s + self.config.settle_s
        while time.monotonic() - started < limit and not self._stop.is_set():
            try:
                with self.engine.connect() as conn:
                    if ids is None:
                        ids = list(conn.execute(select(T.runs.c.run_id).where(
                            T.runs.c.agent == self.config.agent, T.runs.c.state.notin_(terminal),
                            T.runs.c.run_id.in_(self._run_ids()))).scalars())
                    moved_steps = select(T.steps.c.run_id).where(
                        (T.steps.c.started_at >= struck) | (T.steps.c.finished_at >= struck))
                    waiting = conn.execute(select(func.count()).select_from(T.runs).where(
                        T.runs.c.run_id.in_(ids), T.runs.c.state.notin_(terminal), T.runs.c.updated_at < struck,
                        T.runs.c.run_id.notin_(moved_steps))).scalar()
                if waiting == 0:
                    fault.recovery_s = round(time.monotonic() - started, 2)
                    return
            except Exception:
                pass  # the database may be the fault: keep counting
            time.sleep(0.2)

    # -- the reckoning ----------------------------------------------------------------------

    def _settle(self) -> None:
        deadline = time.monotonic() + self.config.settle_s
        while time.monotonic() < deadline:
            try:
                if self._ended() >= len(self.accepted) and len(self.accepted) == self.config.runs:
                    break
            except Exception:
                pass
            time.sleep(0.5)
        for monitor in self._monitors:
            monitor.join(timeout=1)
        time.sleep(2)  # let the last Results arrive on the reply queue

    def _ended(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(T.runs).where(
                T.runs.c.agent == self.config.agent, T.runs.c.goal_id.in_(list(self.accepted)),
                T.runs.c.state.in_([s.value for s in TERMINAL]))).scalar() or 0)

    def _count(self) -> None:
        r = self.report
        run_ids = {run_id_for(self.config.agent, g): g for g in self.accepted}
        with self.engine.connect() as conn:
            runs = conn.execute(select(T.runs.c.run_id, T.runs.c.state, T.runs.c.error_code, T.runs.c.redrives)
                                .where(T.runs.c.run_id.in_(list(run_ids)))).all()
            writes = conn.execute(select(ledger.c.run_id, ledger.c.call_id, func.count())
                                  .where(ledger.c.run_id.in_(list(run_ids)))
                                  .group_by(ledger.c.run_id, ledger.c.call_id)).all()
            steps = conn.execute(select(T.steps.c.run_id, T.steps.c.attempts, T.steps.c.output)
                                 .where(T.steps.c.run_id.in_(list(run_ids)), T.steps.c.kind == "tool")).all()
        ended = {row.run_id: row for row in runs if row.state in {s.value for s in TERMINAL}}
        troubled = {s.run_id for s in steps if s.attempts > 1} | {row.run_id for row in runs if row.redrives}
        unknown = {s.run_id for s in steps if (s.output or {}).get("error_code") == "UNKNOWN_OUTCOME"}
        r.accepted, r.ended = len(self.accepted), len(ended)
        r.lost = len(set(run_ids) - set(ended))
        r.duplicated = sum(1 for w in writes if w[2] > 1)
        r.side_effects = sum(w[2] for w in writes)
        r.unknown_outcomes = len(unknown)
        r.redriven = sum(1 for row in runs if row.redrives)
        r.recovered = len((troubled | unknown) & set(ended))
        r.succeeded = sum(1 for row in ended.values() if row.state == "SUCCEEDED")
        r.failed_by_code = dict(Counter(row.error_code or row.state for row in ended.values()
                                        if row.state != "SUCCEEDED"))
        answered = set()
        for reply in self.replies:
            goal_id = self.sent.get(reply.get("correlation_id") or "")
            if goal_id is None or reply.get("goal_id") != goal_id \
                    or reply.get("run_id") != run_id_for(self.config.agent, goal_id):
                r.unexpected += 1
            else:
                answered.add(goal_id)
        r.answered = len(answered)

    def _delete_topology(self) -> None:
        try:
            with Connection(self.settings.broker_url) as conn:
                conn.ensure_connection(max_retries=5)
                self.topology.delete(conn)
                self.reply_queue(conn).delete()
        except Exception as exc:
            log.warning("could not delete the chaos namespace %s: %s", self.namespace, exc)


def _broker_restart() -> list[list[str]] | None:
    if shutil.which("rabbitmqctl") is None:
        return None
    return [["rabbitmqctl", "stop_app"], ["rabbitmqctl", "start_app"],
            ["rabbitmqctl", "await_startup", "--timeout", "120"]]


def _database_restart() -> list[list[str]] | None:
    clusters = sorted(Path("/etc/postgresql").glob("*/main")) if Path("/etc/postgresql").exists() else []
    if shutil.which("pg_ctlcluster") is None or not clusters:
        return None
    version = clusters[-1].parent.name
    return [["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "stop", "-m", "immediate"],
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"]]
