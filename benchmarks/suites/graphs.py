"""A graph's node beside an agent's iteration and beside LangGraph's node, in the same run.

``bench_graph`` is the overhead suite's LangGraph peer (plan → tool → observe, round and round, no-op nodes) as an
agentfleet graph: each node is a step of its own, checkpointed in Postgres and run by an executor, so one node
costs what one agent iteration costs (plan → tool → observe through the three roles). LangGraph's node is a
function call in one process with a checkpoint written before the next (``durability="sync"``)."""

from __future__ import annotations

import itertools

from agentfleet.store.db import scratch_database
from benchmarks.common import ONE_EACH, PG_ADMIN, Report, Sizes, first_last_tenth_ms, fleet
from benchmarks.peers import run_peer
from benchmarks.suites.overhead import iteration_times_ms

SUITE = "graphs"


def node_times_ms(store: object, run_id: str) -> list[float]:
    """Start-to-start intervals of the run's node steps (one node a step, in this graph)."""
    starts = sorted(s["started_at"] for s in store.steps(run_id) if s["kind"] == "tool")  # type: ignore[attr-defined]
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(starts)]


def run(sizes: Sizes, report: Report) -> None:
    rounds = max(2, sizes.overhead_iterations // 3)
    with fleet(ONE_EACH) as f:
        f.run("bench_graph", {"limit": 3})  # warm-up
        f.run("bench_loop", {"iterations": 5})
        graph_run = f.run("bench_graph", {"limit": rounds})
        loop_run = f.run("bench_loop", {"iterations": rounds * 3 + 1})
        nodes = node_times_ms(f.store, graph_run)
        iterations = iteration_times_ms(f.store, loop_run)
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url:
        langgraph = run_peer("langgraph_loop.py", url, rounds)
    ours = report.add_ms(SUITE, "agentfleet_graph_node", nodes)
    # a node late in a run costs what an early one does (no replay from the start)
    report.add(SUITE, "agentfleet_graph_node_first_last_10pct_median_ms", first_last_tenth_ms(nodes))
    iteration = report.add_ms(SUITE, "agentfleet_agent_iteration", iterations)
    report.add_ratio(SUITE, "graph_node_over_agent_iteration", ours, iteration)
    # LangGraph's samples are plan-to-plan, three nodes each.
    theirs = report.add_ms(SUITE, f"langgraph_{langgraph['version']}_node_sync",
                           [ms / 3 for ms in langgraph["samples_ms_sync"]])
    report.add_ratio(SUITE, "agentfleet_graph_node_over_langgraph_node_sync", ours, theirs)
    report.add(SUITE, "samples", {"graph_nodes": len(nodes), "agent_iterations": len(iterations),
                                  "langgraph_rounds": len(langgraph["samples_ms_sync"])})
