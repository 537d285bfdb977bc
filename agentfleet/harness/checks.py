"""Running one health check within its timeout, into an answer (``tools/health.py`` declares checks).

A function check runs in a thread abandoned at its timeout (Python cannot be killed
from inside its process), and is not started again while that run still hangs; a
command check's whole process group is killed at its timeout, and only the two ends
of its output are kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass

from agentfleet.harness.timeouts import call_with_timeout
from agentfleet.tools.health import HealthCheck

DETAIL_LIMIT = 300
OUTPUT_KEPT = 4096  # bytes of a command check's output kept at each end

_hung: dict[str, threading.Thread] = {}  # a function check's last run, abandoned at its timeout
_hung_lock = threading.Lock()


@dataclass(frozen=True)
class CheckOutcome:
    healthy: bool
    detail: str | None = None


def run_check(check: HealthCheck, timeout_s: float) -> CheckOutcome:
    """Run a check once. Never raises: every way it fails is an answer of ``down`` with a detail."""
    if isinstance(check.target, tuple):
        return _run_command(check.target, timeout_s)
    with _hung_lock:
        hung = _hung.get(check.name)
    if hung is not None and hung.is_alive():
        # A function that hangs cannot be killed; starting it again every TTL would pile up threads.
        return CheckOutcome(False, f"its last run is still running (hung for over {timeout_s:g}s)")
    called = call_with_timeout(check.target, timeout_s, name=f"health:{check.name}")
    if not called.finished:
        with _hung_lock:
            _hung[check.name] = called.thread  # type: ignore[assignment]
        return CheckOutcome(False, f"check did not answer within {timeout_s:g}s")
    if called.error is not None:
        return CheckOutcome(False, _clip(f"{type(called.error).__name__}: {called.error}"))
    return CheckOutcome(True, _clip(str(called.value)) if called.value is not None else None)


def _run_command(argv: tuple[str, ...], timeout_s: float) -> CheckOutcome:
    """Run a command with its output read as it comes and kept only at its two ends (a check that floods
    its output must not flood the executor's memory); the whole process group is killed at the timeout."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as exc:
        return CheckOutcome(False, _clip(f"{argv[0]}: {exc.strerror or exc}"))
    assert proc.stdout is not None
    head, tail = bytearray(), bytearray()

    def drain() -> None:
        for chunk in iter(lambda: proc.stdout.read1(OUTPUT_KEPT), b""):  # type: ignore[union-attr]
            if len(head) < OUTPUT_KEPT:
                head.extend(chunk[: OUTPUT_KEPT - len(head)])
            tail.extend(chunk)
            del tail[:-OUTPUT_KEPT]

    reader = threading.Thread(target=drain, name="health-output", daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: a shell's children go too
        proc.wait()
        reader.join(1)
        return CheckOutcome(False, f"{argv[0]} did not answer within {timeout_s:g}s")
    reader.join(1)
    proc.stdout.close()
    first = bytes(head).decode(errors="replace").strip().splitlines()
    last = bytes(tail).decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        return CheckOutcome(False, _clip(f"{argv[0]} exited {proc.returncode}" + (f": {last[-1]}" if last else "")))
    return CheckOutcome(True, _clip(first[0]) if first else None)


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
