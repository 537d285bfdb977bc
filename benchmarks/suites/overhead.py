"""One agent iteration through real worker processes, beside bare Celery and Celery with one Postgres commit per hop
(timed in turns with it), DBOS and LangGraph in the same run; and the workers' CPU per iteration, by role."""

from __future__ import annotations

import itertools
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from agentfleet.store import Store
from agentfleet.store.db import scratch_database
from benchmarks.celery_floor import floor_workers
from benchmarks.common import (
    ONE_EACH,
    PG_ADMIN,
    REDIS,
    Fleet,
    Report,
    Sizes,
    cpu_ms_per_iteration,
    delete_redis_keys,
    fleet,
    role_cpu_s,
    role_switches,
    switches_of,
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


ROUNDS = 5  # turns of agentfleet, agentfleet with hooks, bare Celery and Celery + commit, one after the other


@dataclass
class Side:
    """One of the things timed in turns: its samples and, for a fleet, its workers' CPU, round by round."""

    rounds: list[list[float]] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    switches: list[float] = field(default_factory=list)  # its workers' voluntary context switches an iteration

    @property
    def samples(self) -> list[float]:
        return [ms for r in self.rounds for ms in r]

    def cpu_per_iteration(self) -> dict[str, float]:
        """The rounds' worker CPU per iteration, by role and in all (each round weighed by its iterations)."""
        n = sum(len(r) + 1 for r in self.rounds)  # a run of k + 1 iterations gives k intervals
        per = {role: round(sum(c[role] * (len(r) + 1) for c, r in zip(self.cpu, self.rounds, strict=True)) / n, 2)
               for role in self.cpu[0] if role != "total"}
        return {**per, "total": round(sum(per.values()), 2)}


def loop_round(f: Fleet, iterations: int, side: Side) -> None:
    """One bench_loop run of ``iterations`` through the fleet: its iteration times and its workers' CPU."""
    before, switched = role_cpu_s(f), role_switches(f)
    run_id = f.run("bench_loop", {"iterations": iterations + 1})
    side.cpu.append(cpu_ms_per_iteration(before, role_cpu_s(f), iterations + 1))
    after = role_switches(f)
    side.switches.append(sum(after[r] - switched[r] for r in after) / (iterations + 1))
    side.rounds.append(iteration_times_ms(f.store, run_id))


def round_ratios(ours: Side, theirs: Side) -> list[float]:
    """Our median over theirs, round by round: each pair timed within the same minute."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(ours.rounds, theirs.rounds, strict=True)]


def run(sizes: Sizes, report: Report) -> None:
    """The fleet (hooks off and on) and both Celery floors are all up at once and timed in turns: ``ROUNDS`` rounds
    of a run through each fleet and a block of chains through each floor. This machine's speed drifts by a fifth
    from one minute to the next: timed minutes apart, three runs of the same code gave ratios to Celery + commit
    from 1.6× to 2.1×. A ratio here is the median of the rounds' ratios, shown with their range."""
    ours, hooked, bare, committed = Side(), Side(), Side(), Side()
    per_round = max(1, sizes.overhead_iterations // ROUNDS)
    chains = max(1, sizes.floor_chains // ROUNDS)
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url, \
            fleet(ONE_EACH) as f, fleet(ONE_EACH, env=HOOKS_ON) as h, \
            floor_workers() as bare_floor, floor_workers(commit_url=url) as commit_floor:
        for warm in (f, h):
            warm.run("bench_loop", {"iterations": 5})  # warm-up: connections, imports, caches
        for _ in range(ROUNDS):
            loop_round(f, per_round, ours)
            loop_round(h, per_round, hooked)
            bare.rounds.append(bare_floor.chain_ms(chains))
            switched = switches_of(commit_floor.pids)
            committed.rounds.append(commit_floor.chain_ms(chains))
            committed.switches.append((switches_of(commit_floor.pids) - switched) / chains)
        dbos = run_peer("dbos_steps.py", url, sizes.peer_iterations)
        langgraph = run_peer("langgraph_loop.py", url, sizes.peer_iterations)

    ours_med = report.add_ms(SUITE, "agentfleet_iteration", ours.samples)
    gated, bare_call = gate_cost_ms(max(200, sizes.overhead_iterations * 5))
    report.add(SUITE, "health_gate_added_median_ms",
               round(statistics.median(gated) - statistics.median(bare_call), 3))
    tenth = max(1, per_round // 10)  # of each run, pooled over the rounds
    report.add(SUITE, "agentfleet_first_last_10pct_median_ms",
               [round(statistics.median([ms for r in ours.rounds for ms in r[:tenth]]), 2),
                round(statistics.median([ms for r in ours.rounds for ms in r[-tenth:]]), 2)])
    cpu, hooked_cpu = ours.cpu_per_iteration(), hooked.cpu_per_iteration()
    report.add(SUITE, "worker_cpu_ms_per_iteration", cpu,
               " + ".join(f"{role} {ms}" for role, ms in cpu.items() if role != "total") + f" = {cpu['total']} ms")
    switches, floor_switches = statistics.median(ours.switches), statistics.median(committed.switches)
    report.add(SUITE, "worker_context_switches_per_iteration",
               {"agentfleet": round(switches, 1), "celery_commit_per_hop_3_hops": round(floor_switches, 1)},
               f"{switches:.1f} (Celery + commit: {floor_switches:.1f} a chain), voluntary, the rounds' median")
    hooked_med = report.add_ms(SUITE, "agentfleet_iteration_hooks_on", hooked.samples)
    hook_ratios = round_ratios(hooked, ours)
    report.add(SUITE, "hooks_on_added", {"median_ms": round(hooked_med - ours_med, 2),
                                         "cpu_ms": round(hooked_cpu["total"] - cpu["total"], 2),
                                         "rounds": [round(r, 2) for r in hook_ratios]},
               f"{hooked_med - ours_med:+.2f} ms median, {_spread(hook_ratios)} of hooks off round by round, "
               f"{hooked_cpu['total'] - cpu['total']:+.2f} ms CPU (metrics, audit log, OpenTelemetry spans)")
    for name, side in (("bare_celery_3_hops", bare), ("celery_commit_per_hop_3_hops", committed)):
        report.add_ms(SUITE, name, side.samples)
        ratios = round_ratios(ours, side)
        report.add(SUITE, f"agentfleet_over_{name}", round(statistics.median(ratios), 2), _spread(ratios))
        report.add(SUITE, f"round_by_round_over_{name}", [round(r, 2) for r in ratios])
    peers = {
        f"dbos_{dbos['version']}_3_step_workflow": dbos["samples_ms"],
        f"langgraph_{langgraph['version']}_3_node_loop_sync": langgraph["samples_ms_sync"],
        f"langgraph_{langgraph['version']}_3_node_loop_async": langgraph["samples_ms_async"],
    }
    for name, samples in peers.items():  # one block each, after the rounds
        theirs = report.add_ms(SUITE, name, samples)
        report.add_ratio(SUITE, f"agentfleet_over_{name}", ours_med, theirs)
    report.add(SUITE, "rounds", ROUNDS)
    report.add(SUITE, "samples", {"agentfleet": len(ours.samples),
                                  "bare_celery_3_hops": len(bare.samples),
                                  "celery_commit_per_hop_3_hops": len(committed.samples),
                                  **{k: len(v) for k, v in peers.items()}})


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}× (rounds {min(ratios):.2f}–{max(ratios):.2f}×)"
