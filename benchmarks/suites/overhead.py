"""One agent iteration through real worker processes, beside bare Celery, Celery with one Postgres commit per hop,
DBOS and LangGraph in the same run; and the workers' CPU per iteration, by role."""

from __future__ import annotations

import itertools
import statistics
import time
import uuid
from pathlib import Path

from agentfleet.store import Store
from agentfleet.store.db import scratch_database
from benchmarks.celery_floor import floor_workers
from benchmarks.common import (
    ONE_EACH,
    PG_ADMIN,
    REDIS,
    Report,
    Sizes,
    cpu_ms_per_iteration,
    delete_redis_keys,
    fleet,
    role_cpu_s,
)
from benchmarks.peers import run_peer

SUITE = "overhead"


def iteration_times_ms(store: Store, run_id: str) -> list[float]:
    """Plan-to-plan intervals: one full iteration (plan → tool → observe) each."""
    starts = sorted(s["started_at"] for s in store.steps(run_id) if s["kind"] == "plan")
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(starts)]


def gate_cost_ms(n: int) -> tuple[list[float], list[float]]:
    """What health-gated dispatch adds to an iteration, alone, against the real Redis.

    Per sample: the planner's offer plus the executor's gated call of the bench's read-only tool
    (health and breaker read, cache miss and store), beside the same call run bare.
    """
    from agentfleet.config.settings import Settings
    from agentfleet.fleet.dispatch import ToolDispatch
    from agentfleet.fleet.fleet_redis import FleetRedis, connect
    from agentfleet.harness.runner import run_tool
    from agentfleet.tools.tool import ToolContext
    from benchmarks.agents import bench_loop

    namespace = f"afbench-gate-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=REDIS, namespace=namespace)
    fleet = FleetRedis(connect(settings), namespace, secret=b"bench")
    dispatch = ToolDispatch(fleet, settings, by="bench", report=lambda t: None)
    tools, noop = list(bench_loop.tools.values()), bench_loop.tools["noop"]
    ctx = ToolContext(run_id="bench", call_id="c", idempotency_key="k", workspace=Path.cwd())
    gated: list[float] = []
    bare: list[float] = []
    try:
        for i in range(n):
            started = time.perf_counter()
            dispatch.offer(tools)
            dispatch.call(noop, {"step": i}, ctx)
            gated.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            run_tool(noop, {"step": i}, ctx, 5.0)
            bare.append((time.perf_counter() - started) * 1000)
    finally:
        delete_redis_keys(namespace)
    return gated, bare


# Every built-in hook on (DESIGN §12): Prometheus metrics served by each worker, the audit log file beside the audit
# rows, OpenTelemetry spans exported (to the console: the worker's log file; no collector to wait on).
HOOKS_ON = {"AGENTFLEET_METRICS_PORT": "0", "AGENTFLEET_AUDIT_LOG": "{tmp}/audit.jsonl",
            "AGENTFLEET_OTEL_EXPORTER": "console"}


def loop_run(iterations: int, env: dict[str, str] | None = None) -> tuple[list[float], dict[str, float]]:
    """One bench_loop run of ``iterations`` through one worker process per role: its iteration times, and the
    workers' CPU per iteration by role."""
    with fleet(ONE_EACH, env=env) as f:
        f.run("bench_loop", {"iterations": 5})  # warm-up: connections, imports, caches
        before = role_cpu_s(f)
        run_id = f.run("bench_loop", {"iterations": iterations + 1})
        cpu = cpu_ms_per_iteration(before, role_cpu_s(f), iterations + 1)
        return iteration_times_ms(f.store, run_id), cpu


def run(sizes: Sizes, report: Report) -> None:
    ours, cpu = loop_run(sizes.overhead_iterations)
    hooked, hooked_cpu = loop_run(sizes.overhead_iterations, HOOKS_ON)
    with floor_workers() as floor:
        bare = floor.chain_ms(sizes.floor_chains)
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url:
        with floor_workers(commit_url=url) as floor:
            committed = floor.chain_ms(sizes.floor_chains)
        dbos = run_peer("dbos_steps.py", url, sizes.peer_iterations)
        langgraph = run_peer("langgraph_loop.py", url, sizes.peer_iterations)

    ours_med = report.add_ms(SUITE, "agentfleet_iteration", ours)
    gated, bare_call = gate_cost_ms(max(200, sizes.overhead_iterations * 5))
    report.add(SUITE, "health_gate_added_median_ms",
               round(statistics.median(gated) - statistics.median(bare_call), 3))
    tenth = max(1, len(ours) // 10)
    report.add(SUITE, "agentfleet_first_last_10pct_median_ms",
               [round(statistics.median(ours[:tenth]), 2), round(statistics.median(ours[-tenth:]), 2)])
    report.add(SUITE, "worker_cpu_ms_per_iteration", cpu,
               " + ".join(f"{role} {ms}" for role, ms in cpu.items() if role != "total") + f" = {cpu['total']} ms")
    hooked_med = report.add_ms(SUITE, "agentfleet_iteration_hooks_on", hooked)
    report.add(SUITE, "hooks_on_added", {"median_ms": round(hooked_med - ours_med, 2),
                                         "cpu_ms": round(hooked_cpu["total"] - cpu["total"], 2)},
               f"{hooked_med - ours_med:+.2f} ms median, {hooked_cpu['total'] - cpu['total']:+.2f} ms CPU "
               "(metrics, audit log, OpenTelemetry spans)")
    peers = {
        "bare_celery_3_hops": bare,
        "celery_commit_per_hop_3_hops": committed,
        f"dbos_{dbos['version']}_3_step_workflow": dbos["samples_ms"],
        f"langgraph_{langgraph['version']}_3_node_loop_sync": langgraph["samples_ms_sync"],
        f"langgraph_{langgraph['version']}_3_node_loop_async": langgraph["samples_ms_async"],
    }
    for name, samples in peers.items():
        theirs = report.add_ms(SUITE, name, samples)
        report.add_ratio(SUITE, f"agentfleet_over_{name}", ours_med, theirs)
    report.add(SUITE, "samples", {"agentfleet": len(ours), **{k: len(v) for k, v in peers.items()}})
