"""Where an iteration's wall time goes, handling by handling (``python -m benchmarks.handling_times [ITERATIONS]``;
figures in benchmarks/README.md, issue 23).

One worker per role, one long ``bench_loop`` run; each worker times its handlings from inside
(``handling_probe/sitecustomize.py``). Printed per role, medians over the run's handlings, in ms: the handling's
wall and CPU time, the part of each spent in psycopg (the client's CPU, and the database and socket besides), in
``Publisher.publish`` (its confirm included), and the round trips to Postgres. An iteration's wall time is about
the three handlings up to their publish plus three deliveries: a publish's wait for its confirm overlaps the next
handling, which has its message by then.

The last column, ``cpu_per_publish``, is the handling's CPU in units of its publish's: on this VM a handling's CPU
drifts by up to ±20% from one run to the next with the machine, while this ratio held within ±3% over four runs of
one version. Two versions that leave the publish alone (the same code, events of about the same size) are compared
by it across runs: issue 23's tenth session measured a batch of ~3% with it, which the raw CPU could not show.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from agentfleet import constants as C
from benchmarks.common import ONE_EACH, ROOT, fleet

PROBE = Path(__file__).resolve().parent / "handling_probe"
FIGURES = ("handling_wall", "handling_cpu", "database_wall", "database_cpu", "publish_wall", "publish_cpu",
           "round_trips_n")


def main(iterations: int = 300) -> None:
    with tempfile.TemporaryDirectory() as out:
        with fleet(ONE_EACH, env={"PYTHONPATH": f"{PROBE}:{ROOT}", "AGENTFLEET_HANDLING_PROBE": out}) as f:
            f.run("bench_loop", {"iterations": 5})
            started = time.perf_counter()
            run_id = f.run("bench_loop", {"iterations": iterations})
            wall_ms = (time.perf_counter() - started) * 1000 / iterations
        figures: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for path in Path(out).glob("*.jsonl"):
            for line in path.read_text().splitlines():
                role, run, times = json.loads(line)
                if run == run_id:
                    for name in FIGURES:
                        figures[role][name].append(times.get(name, 0.0) * (1 if name.endswith("_n") else 1000))
    print(f"{iterations} iterations, {wall_ms:.2f} ms each (wall, the run's start to its end)")
    print(f"{'role':9s} " + " ".join(f"{name:>14s}" for name in (*FIGURES, "cpu_per_publish")))
    total = dict.fromkeys(FIGURES, 0.0)
    for role in C.ROLES:
        medians = {name: statistics.median(figures[role][name]) for name in FIGURES}
        for name, value in medians.items():
            total[name] += value
        print(f"{role:9s} " + " ".join(f"{medians[name]:14.2f}" for name in FIGURES) + f" {per_publish(medians):14.2f}")
    print(f"{'together':9s} " + " ".join(f"{total[name]:14.2f}" for name in FIGURES) + f" {per_publish(total):14.2f}")


def per_publish(figures: dict[str, float]) -> float:
    """A handling's CPU in units of its publish's (0 when nothing was published)."""
    return figures["handling_cpu"] / figures["publish_cpu"] if figures["publish_cpu"] else 0.0


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
