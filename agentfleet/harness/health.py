"""Declaring a tool's health check, and running one within its timeout.

A check is a plain function (returns nothing or a detail string, raises when the
tool cannot work) or a command line for runtime checks (``["node", "--version"]``).
Tools that depend on the same thing share one check by name, so it runs once for
all of them. Where and how often checks run, and what the fleet does with their
answers, is ``health_cache``'s business.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agentfleet import constants as C
from agentfleet.errors import ConfigurationError
from agentfleet.harness.timeouts import call_with_timeout

Tier = Literal["model", "database", "http", "local"]
TIERS: tuple[str, ...] = tuple(C.TIER_TIMEOUTS_S)
DETAIL_LIMIT = 300


@dataclass(frozen=True)
class HealthCheck:
    """A named check. ``ttl_s`` / ``down_ttl_s`` override how long its answer counts fleet-wide."""

    name: str
    target: Callable[[], object] | tuple[str, ...]
    tier: Tier = "local"
    timeout_s: float | None = None
    ttl_s: float | None = None
    down_ttl_s: float | None = None

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ConfigurationError(f"health check {self.name!r}: tier must be one of {', '.join(TIERS)}")
        if isinstance(self.target, tuple) and (not self.target or not all(isinstance(a, str) for a in self.target)):
            raise ConfigurationError(f"health check {self.name!r}: a command is a non-empty list of strings")
        for what in ("timeout_s", "ttl_s", "down_ttl_s"):
            value = getattr(self, what)
            if value is not None and value <= 0:
                raise ConfigurationError(f"health check {self.name!r}: {what} must be positive")


@dataclass(frozen=True)
class CheckOutcome:
    healthy: bool
    detail: str | None = None


_named: dict[str, HealthCheck] = {}
_hung: dict[str, threading.Thread] = {}  # a function check's last run, abandoned at its timeout
_named_lock = threading.Lock()
OUTPUT_KEPT = 4096  # bytes of a command check's output kept at each end


def health_check(
    name: str,
    target: Callable[[], object] | Sequence[str],
    *,
    tier: Tier = "local",
    timeout_s: float | None = None,
    ttl_s: float | None = None,
    down_ttl_s: float | None = None,
) -> HealthCheck:
    """Declare a check that several tools share: ``@tool(health_check="node")`` then names it."""
    check = HealthCheck(name, target if callable(target) else tuple(target), tier, timeout_s, ttl_s, down_ttl_s)
    with _named_lock:
        existing = _named.get(name)
        if existing is not None and existing != check:
            raise ConfigurationError(f"health check {name!r} is declared twice, differently")
        _named[name] = check
    return check


def as_health_check(spec: object, tool_name: str, tier: Tier) -> HealthCheck | None:
    """What ``@tool(health_check=...)`` was given, as a check: a name, a check, a function or a command."""
    if spec is None or isinstance(spec, HealthCheck):
        return spec
    if isinstance(spec, str):
        check = _named.get(spec)
        if check is None:
            raise ConfigurationError(f"tool {tool_name!r}: no health check named {spec!r} (declare it first with "
                                     "health_check(name, ...))")
        return check
    if callable(spec):
        return HealthCheck(tool_name, spec, tier)
    if isinstance(spec, list | tuple):
        return HealthCheck(tool_name, tuple(spec), tier)
    raise ConfigurationError(f"tool {tool_name!r}: health_check must be a function, a command (list of strings), "
                             "a HealthCheck or a check's name")


def run_check(check: HealthCheck, timeout_s: float) -> CheckOutcome:
    """Run a check once. Never raises: every way it fails is an answer of ``down`` with a detail."""
    if isinstance(check.target, tuple):
        return _run_command(check.target, timeout_s)
    with _named_lock:
        hung = _hung.get(check.name)
    if hung is not None and hung.is_alive():
        # A function that hangs cannot be killed; starting it again every TTL would pile up threads.
        return CheckOutcome(False, f"its last run is still running (hung for over {timeout_s:g}s)")
    called = call_with_timeout(check.target, timeout_s, name=f"health:{check.name}")
    if not called.finished:
        with _named_lock:
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
