"""Iterations per second with 1, 2, 4 worker processes per role and many runs in flight, beside bare Celery and
Celery with one Postgres commit per hop.

Then the same at one process per role with Celery's prefork pool instead of threads (DESIGN §1:
the pool is a measured choice).

Both are CPU-bound on two cores, so beside each rate: the whole machine's CPU per iteration (per chain for the
floor), split into the workers, RabbitMQ, Postgres, Redis, the client and the rest. The rates' ratio follows the
totals' ratio; the split says whose CPU makes the gap.

The fleet and Celery + commit are measured in turns: both are up at once, each idle while the other takes a burst,
the order alternating (fleet then floor, floor then fleet, ...). Each turn's ratio compares the two under the same
machine state; the figure is the median of the turns' ratios. Measured one after the other, minutes apart, the ratio
moved between 0.63 and 0.83 from one run to the next with nothing changed (this project's VMs drift by ±20%).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import text

from agentfleet import constants as C
from agentfleet.loop.states import TERMINAL, RunState
from agentfleet.store.db import scratch_database
from agentfleet.workers.roles import ROLES
from benchmarks.celery_floor import Floor, floor_workers
from benchmarks.common import PG_ADMIN, Fleet, MachineCpu, Report, Sizes, fleet, wait_until

SUITE = "throughput"
TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in TERMINAL)


def iterations_per_s(f: Fleet, runs: int, iterations: int) -> float:
    """Publish ``runs`` goals at once; iterations completed per second, first publish to last run's end."""
    t0 = time.time()
    run_ids = f.submit("bench_loop", [{"iterations": iterations + 1}] * runs)
    ended = f"SELECT count(*) FROM runs WHERE run_id = ANY(:ids) AND state IN ({TERMINAL_SQL})"
    wait_until(lambda: f.count(ended, ids=run_ids) == runs, f"{runs} runs to end", timeout=120 + runs * iterations)
    failed = f.count(f"SELECT count(*) FROM runs WHERE run_id = ANY(:ids) AND state != '{RunState.SUCCEEDED.value}'",
                     ids=run_ids)
    if failed:
        raise RuntimeError(f"{failed} of {runs} throughput runs did not succeed; logs in {f.workers.logdir}")
    with f.store.engine.connect() as conn:
        last = conn.execute(text("SELECT max(updated_at) FROM runs WHERE run_id = ANY(:ids)"), {"ids": run_ids})
        elapsed = last.scalar_one().timestamp() - t0
    return runs * iterations / elapsed


@dataclass
class Turns:
    """The fleet's bursts and Celery + commit's, taken in turns: rates, and the machine's CPU a unit, per burst."""

    together: bool = True  # both up at once, the bursts alternating; else the fleet's first, then the floor's
    ours: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    ours_cpu: list[dict[str, float]] = field(default_factory=list)
    floor_cpu: list[dict[str, float]] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Each turn's fleet rate over the floor's."""
        return [o / c for o, c in zip(self.ours, self.floor, strict=True)]


# Postgres connections a worker process may hold beyond one a pool thread (its sweeper, inbox and timers' reads), and
# those the server keeps for itself and for this process: what decides whether both sides fit at once.
EXTRA_PER_PROCESS = 2
HELD_BACK = 10


def connections_at_once(per_role: int) -> int:
    """Connections the fleet and Celery + commit may hold when both are up: one a pool thread, and a few a process."""
    floor = 3 * per_role * ROLES[C.PLANNER].default_concurrency
    ours = per_role * sum(role.default_concurrency + EXTRA_PER_PROCESS for role in ROLES.values())
    return floor + ours + HELD_BACK


def in_turns(per_role: int, sizes: Sizes) -> Turns:
    """``per_role`` worker processes a role beside Celery + one Postgres commit a hop (over a scratch database, as
    many thread-pool processes a queue with the planner's thread count each), both up, bursts in turns.

    When both would hold more connections than the server takes (``max_connections``: at 4 per role, 100 here), a
    floor burst's hops failed to connect and its chains were lost: then the fleet takes its bursts first, alone, and
    the floor its own after (``Turns.together`` False)."""
    turns = Turns()
    iterations = sizes.throughput_runs * sizes.throughput_iterations

    def ours(f: Fleet) -> None:
        cpu = MachineCpu.of(f.pids())
        turns.ours.append(iterations_per_s(f, sizes.throughput_runs, sizes.throughput_iterations))
        turns.ours_cpu.append(cpu.ms_per(iterations))

    def theirs(floor: Floor) -> None:
        cpu = MachineCpu.of(floor.pids)
        turns.floor.append(floor.burst_per_s(sizes.floor_burst))
        turns.floor_cpu.append(cpu.ms_per(sizes.floor_burst))

    with fleet(dict.fromkeys(ROLES, per_role)) as f:
        f.run("bench_loop", {"iterations": 3})  # warm-up
        turns.together = connections_at_once(per_role) <= max_connections(f)
        if turns.together:
            with committing_floor(per_role) as floor:
                for turn in range(sizes.throughput_turns):
                    if turn % 2 == 0:
                        ours(f)
                        theirs(floor)
                    else:
                        theirs(floor)
                        ours(f)
            return turns
        for _ in range(sizes.throughput_turns):
            ours(f)
    with committing_floor(per_role) as floor:
        for _ in range(sizes.throughput_turns):
            theirs(floor)
    return turns


@contextmanager
def committing_floor(per_queue: int) -> Iterator[Floor]:
    """Celery + one Postgres commit a hop over a scratch database: as many thread-pool processes a queue, with the
    planner's thread count each."""
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url, \
            floor_workers(per_queue=per_queue, concurrency=ROLES[C.PLANNER].default_concurrency,
                          commit_url=url) as floor:
        yield floor


def max_connections(f: Fleet) -> int:
    return f.count("SELECT current_setting('max_connections')::int")


def median_cpu(bursts: list[dict[str, float]]) -> dict[str, float]:
    """Each group's median over the bursts (the total too, so the parts need not add up to it exactly)."""
    return {group: round(statistics.median(b[group] for b in bursts), 2) for group in bursts[0]}


def shown(cpu: dict[str, float]) -> str:
    return f"{cpu['total']} ms: " + ", ".join(f"{group} {ms}" for group, ms in cpu.items() if group != "total")


def run(sizes: Sizes, report: Report) -> None:
    ours_at_1 = bare_at_1 = 0.0
    for n in sizes.throughput_workers:
        turns = in_turns(n, sizes)  # the fleet beside Celery + one Postgres commit a hop (the floor for durable hops)
        ours, committed = statistics.median(turns.ours), statistics.median(turns.floor)
        ours_cpu, committed_cpu = median_cpu(turns.ours_cpu), median_cpu(turns.floor_cpu)
        # Bare Celery with the same process count per queue and the planner's thread count each, once.
        with floor_workers(per_queue=n, concurrency=ROLES[C.PLANNER].default_concurrency) as floor:
            bare = floor.burst_per_s(sizes.floor_burst)
        ours_at_1, bare_at_1 = ours_at_1 or ours, bare_at_1 or bare
        report.add(SUITE, f"agentfleet_iterations_per_s_{n}_per_role", round(ours, 1),
                   f"{ours:.1f} ({ours / ours_at_1:.2f}× of 1 per role; medians of the turns)")
        report.add(SUITE, f"bare_celery_3_hop_chains_per_s_{n}_per_queue", round(bare, 1),
                   f"{bare:.1f} = {3 * bare:.0f} no-op tasks/s ({bare / bare_at_1:.2f}× of 1 per queue)")
        report.add_ratio(SUITE, f"bare_celery_over_agentfleet_{n}", bare, ours)
        report.add(SUITE, f"celery_commit_per_hop_3_hop_chains_per_s_{n}_per_queue", round(committed, 1))
        ratio = statistics.median(turns.ratios)
        how = "turns" if turns.together else "bursts a side, one side after the other (too many connections at once)"
        report.add(SUITE, f"agentfleet_over_celery_commit_throughput_{n}", round(ratio, 2),
                   f"{ratio:.2f}× (goal ≥ 0.8×), the median of {len(turns.ratios)} {how}: "
                   + ", ".join(f"{r:.2f}" for r in turns.ratios))
        report.add(SUITE, f"agentfleet_over_celery_commit_turns_{n}", [round(r, 4) for r in turns.ratios])
        report.add(SUITE, f"agentfleet_machine_cpu_ms_per_iteration_{n}_per_role", ours_cpu, shown(ours_cpu))
        report.add(SUITE, f"celery_commit_machine_cpu_ms_per_chain_{n}_per_queue", committed_cpu,
                   shown(committed_cpu) + f" (agentfleet's total {ours_cpu['total'] / committed_cpu['total']:.2f}×)")
    with fleet(dict.fromkeys(ROLES, 1), "--pool", "prefork") as f:
        f.run("bench_loop", {"iterations": 3})
        prefork = iterations_per_s(f, sizes.throughput_runs, sizes.throughput_iterations)
    report.add(SUITE, "agentfleet_iterations_per_s_1_per_role_prefork", round(prefork, 1),
               f"{prefork:.1f} ({prefork / ours_at_1:.2f}× of the thread pool)")
    report.add(SUITE, "in_flight", {"runs": sizes.throughput_runs, "iterations_each": sizes.throughput_iterations,
                                    "bare_chains": sizes.floor_burst, "turns": sizes.throughput_turns})
