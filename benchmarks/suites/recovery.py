"""SIGKILL the executor mid-step; time until the step runs again on the other executor (its redelivery writes the
step's intent, as its second attempt)."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentfleet import constants as C
from agentfleet.store import Store
from benchmarks.agents import NAPPING
from benchmarks.common import Report, Sizes, fleet, wait_until

SUITE = "recovery"


def run(sizes: Sizes, report: Report) -> None:
    gaps: list[float] = []
    with fleet({C.PLANNER: 1, C.EXECUTOR: 2, C.OBSERVER: 1}) as f:
        for _ in range(sizes.recovery_kills):
            (run_id,) = f.submit("bench_loop", [{"iterations": 2, "nap_s": 1.5}])
            napping = f.workspace / NAPPING.format(run_id=run_id)  # nap's first attempt writes no step to watch
            began = wait_until(functools.partial(_lines, napping), f"a nap of {run_id}", timeout=60, interval=0.005)
            pid = int(began[0])
            if pid not in f.pids(C.EXECUTOR):
                raise RuntimeError(f"the nap of {run_id} ran in {pid}, no live executor")
            os.kill(pid, signal.SIGKILL)
            killed_at = datetime.now(UTC)
            again = _wait_step(f.store, run_id, lambda s: s["attempts"] >= 2)
            gaps.append((again["started_at"] - killed_at).total_seconds() * 1000)
            f.workers.start(C.EXECUTOR)  # keep two executors
            f.workers.wait_ready()
    report.add(SUITE, "kills", len(gaps))
    report.add_ms(SUITE, "kill_to_rerun", gaps)


def _wait_step(store: Store, run_id: str, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    return wait_until(lambda: next((s for s in store.steps(run_id) if s["kind"] == "tool" and ok(s)), None),
                      f"a tool step of {run_id}", timeout=60, interval=0.005)


def _lines(path: Path) -> list[str]:
    """The whole lines written to ``path`` so far (none while it does not exist)."""
    text = path.read_text() if path.exists() else ""
    return text[:text.rfind("\n") + 1].split()
