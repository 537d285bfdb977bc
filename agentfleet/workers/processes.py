"""A local fleet of real ``agentfleet worker`` processes: for tests, benchmarks and trying it out."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kombu.exceptions import OperationalError

from agentfleet.config.settings import Settings
from agentfleet.workers.app import create_app

log = logging.getLogger(__name__)

PING_ROUND_S = 0.25  # how long a round of wait_ready's pings waits for answers, at first
PING_SHORT_FOR_S = 10.0  # ... and for how long it asks in rounds that short


class WorkerProcesses:
    """Starts role workers as subprocesses sharing one environment; stops (or kills) them."""

    def __init__(self, env: dict[str, str], logdir: Path, cwd: Path | None = None) -> None:
        self.env = {**os.environ, **env}
        self.logdir = logdir
        self.cwd = cwd
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        logdir.mkdir(parents=True, exist_ok=True)

    def name(self, role: str, index: int) -> str:
        """Node names are unique per namespace: a node's remote-control queue is exclusive on the broker."""
        return f"{role}.{index}@{self.env.get('AGENTFLEET_NAMESPACE', 'agentfleet')}"

    def start(self, role: str, *extra: str) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        log = (self.logdir / f"{role}-{index}.log").open("wb")
        proc = subprocess.Popen(  # a session of its own: a kill takes a prefork worker's children too
            [sys.executable, "-m", "agentfleet.cli", "worker", role, "--hostname", self.name(role, index), *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, start_new_session=True,
        )
        self.procs.append((self.name(role, index), proc))
        return proc

    def kill(self, name: str) -> bool:
        """SIGKILL a worker and every process it started (as a machine or container dying would)."""
        proc = next((p for n, p in self.procs if n == name and p.poll() is None), None)
        if proc is None:
            return False
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        proc.wait()
        return True

    def pid_of(self, name: str) -> int | None:
        return next((p.pid for n, p in self.procs if n == name and p.poll() is None), None)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every live worker has answered a ping over the broker.

        A ping sent before a worker consumes its remote-control queue is lost, so the workers are asked again and
        again, each time only those not heard from yet: in short rounds (``PING_ROUND_S``) at first, since a worker
        answers in milliseconds once up and a round that waits a whole second for the last one to start was most of
        a test fleet's start; in rounds of a second after ``PING_SHORT_FOR_S``, for a machine too busy to answer
        that fast.
        """
        app = create_app(Settings(broker_url=self.env["AGENTFLEET_BROKER_URL"],
                                  namespace=self.env["AGENTFLEET_NAMESPACE"]))
        wanted = {name for name, proc in self.procs if proc.poll() is None}
        started = time.monotonic()
        deadline = started + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            round_s = PING_ROUND_S if time.monotonic() - started < PING_SHORT_FOR_S else 1.0
            try:
                # A connection of its own each time: kombu's pool is process-wide, and after a broker restart it
                # hands out a connection that is already dead (the first ping after `agentfleet chaos` failed so).
                with app.connection() as conn:
                    replies = app.control.ping(destination=sorted(wanted - seen), timeout=round_s,
                                               connection=conn) or []
            except (OSError, OperationalError) as exc:  # the broker is still coming back: ask again until the deadline
                log.warning("workers not pinged yet: %s", exc)
                time.sleep(0.5)
                continue
            seen |= {name for reply in replies for name in reply}
            if wanted <= seen:
                return
            dead = [(n, p.returncode) for n, p in self.procs if p.poll() is not None and n in wanted]
            if dead:  # what the worker said last is the only trace a CI run keeps of why
                raise RuntimeError(f"workers exited: {dead}; logs in {self.logdir}\n{self.logs()}")
        raise TimeoutError(f"workers not ready: {wanted - seen}; logs in {self.logdir}")

    def logged(self, text: str) -> bool:
        """Whether any worker's whole log has ``text`` (``logs()`` keeps only each log's tail)."""
        return any(text in p.read_text(errors="replace") for p in self.logdir.glob("*.log"))

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
