"""The benchmark code runs (on a tiny size). Figures are printed by `agentfleet bench`, never asserted here."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import require

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("suite", ["overhead", "throughput", "recovery", "growth", "in_flight",
                                   "delegation", "approvals", "profile", "retention", "schedules", "console"])
def test_each_benchmark_suite_runs_on_a_tiny_size(suite: str) -> None:
    require("rabbitmq", "postgres", "redis")
    from benchmarks import run as bench

    sizes = bench.Sizes.tiny()
    report = bench.run([suite], sizes)
    assert report.figures["machine"]["cores"]
    figures = report.figures[suite]
    assert figures and all(v is not None for v in figures.values())
    if suite == "overhead":  # every peer measured, each with a ratio
        assert {k for k in figures if k.startswith("agentfleet_over_")} == {
            f"agentfleet_over_{peer}" for peer in figures["samples"] if peer != "agentfleet"}
        assert len(figures["samples"]) == 6
        assert "agentfleet_over_celery_commit_per_hop_3_hops" in figures  # the floor for durable hops
        # timed in turns with the fleet: a ratio per round, all of them shown
        assert len(figures["round_by_round_over_celery_commit_per_hop_3_hops"]) == figures["rounds"] > 1
        cpu = figures["worker_cpu_ms_per_iteration"]
        assert set(cpu) == {"planner", "executor", "observer", "total"} and cpu["total"] > 0
        switches = figures["worker_context_switches_per_iteration"]  # what they count: test_machine_cpu.py
        assert switches["agentfleet"] > 0 and switches["celery_commit_per_hop_3_hops"] > 0
    if suite == "throughput":
        assert figures["celery_commit_per_hop_3_hop_chains_per_s_1_per_queue"] > 0
        assert figures["agentfleet_over_celery_commit_throughput_1"] > 0
        # taken in turns with the fleet: a ratio per turn, all of them kept, the figure their median
        turns = figures["agentfleet_over_celery_commit_turns_1"]
        assert len(turns) == sizes.throughput_turns > 1
        assert figures["agentfleet_over_celery_commit_throughput_1"] == round(statistics.median(turns), 2)
        # the whole machine's CPU, split, for both sides (what the split counts: tests/bench/test_machine_cpu.py)
        for name in ("agentfleet_machine_cpu_ms_per_iteration_1_per_role",
                     "celery_commit_machine_cpu_ms_per_chain_1_per_queue"):
            cpu = figures[name]
            assert set(cpu) == {"workers", "rabbitmq", "postgres", "redis", "client", "rest", "total"}
            assert cpu["workers"] > 0, f"{name}: the workers under test were not found"
    if suite == "growth":
        assert figures["iterations"] == sizes.growth_iterations
        # the issue's check: long runs' first and last tenths, timed (plan to plan), pooled, and their ratio; and the
        # same past a small window, the prompt compacted from the first tenth on (its assembly must not grow)
        assert figures["long_run_iterations"] == sizes.long_run_iterations
        for kind, runs in (("long_run", "long_runs"), ("past_window", "past_window_runs")):
            first, last = figures[f"{kind}_first_last_10pct_median_ms"]
            assert first > 0 and last > 0 and figures[f"{kind}_last_over_first"] == round(last / first, 3)
            assert len(figures[f"{kind}_last_over_first_each"]) == figures[runs] == sizes.long_runs > 1
            # and the CPU an iteration over the same tenths (the workers', the machine's), which a busy neighbour
            # does not move
            for who in ("worker", "machine"):
                first, last = figures[f"{kind}_{who}_cpu_first_last_10pct_ms"]
                assert first > 0 and last > 0 and figures[f"{kind}_{who}_cpu_last_over_first"] == round(last / first, 3)
        assert figures["past_window_turns_folded_at_the_end"] > 0
    if suite == "recovery":
        assert figures["kills"] == 1
    if suite == "in_flight":
        assert figures["parked_runs"] == sizes.parked_runs
    if suite == "console":  # every page was fetched, with the copies in the database
        assert figures["runs_in_database"] >= sizes.console_runs
        assert {"runs_median_ms", "run_median_ms", "approvals_median_ms", "activity_median_ms", "fleet_median_ms",
                "dlq_median_ms", "runs_by_goal_id_median_ms"} <= set(figures)
    if suite == "delegation":
        assert figures["waiting_parents"] == sizes.waiting_parents
    if suite == "approvals":
        assert figures["parked_runs"] == sizes.approval_runs
        assert figures["runs_ended_after_approval"] == sizes.approval_runs
    if suite == "retention":
        assert figures["ended_runs_pruned"] == sizes.retention_runs
        assert figures["load_failed_alone_beside_again"] == [0, 0, 0]
    if suite == "schedules":
        assert figures["ticks_lost"] == figures["ticks_doubled"] == 0 and figures["runs_started"] >= 1
    if suite == "profile":
        assert all(figures[f"{role}_cpu_by_package"] for role in ("planner", "executor", "observer"))
        # the same run's worker CPU without the sampler beside it, and what attaching it added
        unsampled = figures["worker_cpu_ms_per_iteration_unsampled"]
        sampled = sum(figures[f"{role}_cpu_ms_per_iteration"] for role in ("planner", "executor", "observer"))
        assert unsampled > 0 and figures["sampled_over_unsampled"] == round(sampled / unsampled, 2)

