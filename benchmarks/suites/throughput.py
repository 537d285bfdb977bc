"""Iterations per second with 1, 2, 4 worker processes per role and many runs in flight, beside bare Celery and
Celery with one Postgres commit per hop.

Then the same at one process per role with Celery's prefork pool instead of threads (DESIGN §1:
the pool is a measured choice).

Both are CPU-bound on two cores, so beside each rate: the whole machine's CPU per iteration (per chain for the
floor), split into the workers, RabbitMQ, Postgres, Redis, the client and the rest. The rates' ratio follows the
totals' ratio; the split says whose CPU makes the gap.
"""

from __future__ import annotations

import time

from sqlalchemy import text

from agentfleet import constants as C
from agentfleet.loop.states import TERMINAL, RunState
from agentfleet.store.db import scratch_database
from agentfleet.workers.roles import ROLES
from benchmarks.celery_floor import floor_workers
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


def committed_floor(per_queue: int, chains: int) -> tuple[float, dict[str, float]]:
    """Celery + one Postgres commit a hop over a scratch database, ``per_queue`` thread-pool processes a queue with the
    planner's thread count each: chains per second of a burst of ``chains``, and the machine's CPU a chain."""
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url, \
            floor_workers(per_queue=per_queue, concurrency=ROLES[C.PLANNER].default_concurrency,
                          commit_url=url) as floor:
        cpu = MachineCpu.of(floor.pids)
        rate = floor.burst_per_s(chains)
        return rate, cpu.ms_per(chains)


def shown(cpu: dict[str, float]) -> str:
    return f"{cpu['total']} ms: " + ", ".join(f"{group} {ms}" for group, ms in cpu.items() if group != "total")


def run(sizes: Sizes, report: Report) -> None:
    ours_at_1 = bare_at_1 = 0.0
    iterations = sizes.throughput_runs * sizes.throughput_iterations
    for n in sizes.throughput_workers:
        with fleet(dict.fromkeys(ROLES, n)) as f:
            f.run("bench_loop", {"iterations": 3})  # warm-up
            cpu = MachineCpu.of(f.pids())
            ours = iterations_per_s(f, sizes.throughput_runs, sizes.throughput_iterations)
            ours_cpu = cpu.ms_per(iterations)
        # Bare Celery with the same process count per queue and the planner's thread count each; then the same
        # with one Postgres commit per hop (the floor for durable hops).
        threads = ROLES[C.PLANNER].default_concurrency
        with floor_workers(per_queue=n, concurrency=threads) as floor:
            bare = floor.burst_per_s(sizes.floor_burst)
        committed, committed_cpu = committed_floor(n, sizes.floor_burst)
        ours_at_1, bare_at_1 = ours_at_1 or ours, bare_at_1 or bare
        report.add(SUITE, f"agentfleet_iterations_per_s_{n}_per_role", round(ours, 1),
                   f"{ours:.1f} ({ours / ours_at_1:.2f}× of 1 per role)")
        report.add(SUITE, f"bare_celery_3_hop_chains_per_s_{n}_per_queue", round(bare, 1),
                   f"{bare:.1f} = {3 * bare:.0f} no-op tasks/s ({bare / bare_at_1:.2f}× of 1 per queue)")
        report.add_ratio(SUITE, f"bare_celery_over_agentfleet_{n}", bare, ours)
        report.add(SUITE, f"celery_commit_per_hop_3_hop_chains_per_s_{n}_per_queue", round(committed, 1))
        report.add(SUITE, f"agentfleet_over_celery_commit_throughput_{n}", round(ours / committed, 2),
                   f"{ours / committed:.2f}× (goal ≥ 0.8×)")
        report.add(SUITE, f"agentfleet_machine_cpu_ms_per_iteration_{n}_per_role", ours_cpu, shown(ours_cpu))
        report.add(SUITE, f"celery_commit_machine_cpu_ms_per_chain_{n}_per_queue", committed_cpu,
                   shown(committed_cpu) + f" (agentfleet's total {ours_cpu['total'] / committed_cpu['total']:.2f}×)")
    with fleet(dict.fromkeys(ROLES, 1), "--pool", "prefork") as f:
        f.run("bench_loop", {"iterations": 3})
        prefork = iterations_per_s(f, sizes.throughput_runs, sizes.throughput_iterations)
    report.add(SUITE, "agentfleet_iterations_per_s_1_per_role_prefork", round(prefork, 1),
               f"{prefork:.1f} ({prefork / ours_at_1:.2f}× of the thread pool)")
    report.add(SUITE, "in_flight", {"runs": sizes.throughput_runs, "iterations_each": sizes.throughput_iterations,
                                    "bare_chains": sizes.floor_burst})
