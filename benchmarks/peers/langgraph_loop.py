"""LangGraph: a plan → tool → observe → plan loop with the Postgres checkpointer, ``durability="sync"``.

Runs in the peers' virtual environment. Prints JSON: plan-to-plan milliseconds and the version.
``sync`` writes each checkpoint before the next node runs, the guarantee agentfleet gives; the
default ``async`` overlaps the write with the next node, so it is measured too.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
import uuid
from importlib.metadata import version
from typing import TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    step: int
    limit: int
    last: dict


def build(starts: list[float]):
    def plan(state: State) -> dict:
        starts.append(time.perf_counter())
        return {"last": {"call": "noop", "step": state["step"]}}

    def tool(state: State) -> dict:
        return {"last": {"step": state["last"]["step"]}}

    def observe(state: State) -> dict:
        return {"step": state["step"] + 1}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("tool", tool)
    graph.add_node("observe", observe)
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", lambda s: END if s["step"] >= s["limit"] else "tool")
    graph.add_edge("tool", "observe")
    graph.add_edge("observe", "plan")
    return graph


def main(url: str, iterations: int) -> None:
    out: dict = {"peer": "langgraph", "version": version("langgraph"),
                 "checkpointer": version("langgraph-checkpoint-postgres")}
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        for durability in ("sync", "async"):
            starts: list[float] = []
            app = build(starts).compile(checkpointer=saver)
            app.invoke({"step": 0, "limit": 5, "last": {}},  # warm-up
                       {"configurable": {"thread_id": uuid.uuid4().hex}}, durability=durability)
            starts.clear()
            app.invoke({"step": 0, "limit": iterations, "last": {}},
                       {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * iterations + 10},
                       durability=durability)
            out[f"samples_ms_{durability}"] = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
