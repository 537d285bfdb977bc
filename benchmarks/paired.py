"""Two versions of the fleet on one machine at one time: worker CPU and wall an iteration, round by round
(``python -m benchmarks.paired TREE_A TREE_B [ROUNDS] [ITERATIONS]``; figures in benchmarks/README.md, issue 23).

This project's VMs drift by ±20% within minutes, and two versions benchmarked one after the other (``bench overhead``
in turns) differ by as much when they are the same code. Here both run at once: a fleet from each checkout (one
worker a role, each with its checkout as its working directory, which ``python -m`` puts first on the path), each
over its own scratch database and namespace, idle while the other works. Rounds of ``bench_loop`` alternate between
them (A then B, then B then A), and each round's figures are read from ``/proc`` (every worker's CPU) and the clock.
A round's B/A ratio compares two versions under the same machine state; the median of the ratios is the figure.
Run A against A for the method's own spread.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import ONE_EACH, Fleet, cpu_ms_per_iteration, fleet, role_cpu_s


def one_round(running: Fleet, iterations: int) -> tuple[float, float]:
    """Worker CPU and wall, ms an iteration, of one ``bench_loop`` run."""
    cpu, wall = role_cpu_s(running), time.perf_counter()
    running.run("bench_loop", {"iterations": iterations})
    wall_ms = (time.perf_counter() - wall) * 1000 / iterations
    return cpu_ms_per_iteration(cpu, role_cpu_s(running), iterations)["total"], wall_ms


def main(tree_a: str, tree_b: str, rounds: int = 10, iterations: int = 150) -> None:
    with fleet(ONE_EACH, root=Path(tree_a).resolve()) as a, fleet(ONE_EACH, root=Path(tree_b).resolve()) as b:
        fleets = {"A": a, "B": b}
        for running in fleets.values():
            running.run("bench_loop", {"iterations": 20})
        figures: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
        for r in range(rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                figures[name].append(one_round(fleets[name], iterations))
    for name, tree in (("A", tree_a), ("B", tree_b)):
        cpu, wall = (statistics.median(f[i] for f in figures[name]) for i in (0, 1))
        print(f"{name} {tree}: worker CPU {cpu:.2f} ms an iteration, wall {wall:.2f} ms (medians of {rounds} rounds "
              f"of {iterations})")
    for i, what in enumerate(("worker CPU", "wall")):
        ratios = [b[i] / a[i] for a, b in zip(figures["A"], figures["B"], strict=True)]
        print(f"B/A {what}: median {statistics.median(ratios):.3f}, rounds {', '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:5]))
