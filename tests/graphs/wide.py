"""A graph for the fleet tests: a map of ``n`` branches joined once (imported by workers as an agents module)."""

from typing import Annotated

from pydantic import BaseModel

from agentfleet import END, START, Graph, append, register_graph


class Wide(BaseModel):
    n: int
    items: list[int] = []
    squares: Annotated[list[int], append] = []
    total: int = 0


wide = register_graph(
    Graph("wide", state=Wide)
    .node("plan", lambda s: {"items": list(range(s.n))}, reads=["n"], writes=["items"])
    .node("square", lambda s, item: {"squares": [item * item]}, writes=["squares"])
    .node("add", lambda s: {"total": sum(s.squares)}, reads=["squares"], writes=["total"])
    .edge(START, "plan").map("plan", "square", over="items").edge("square", "add").edge("add", END))


class Outer(BaseModel):
    n: int
    total: int = 0
    shipped: str = ""
    napped: str = ""


def ship(state: Outer) -> dict:
    return {"shipped": f"shipped {state.total}"}


def nap(state: Outer) -> dict:
    import time

    time.sleep(5)
    return {"napped": "woke"}


# A graph as a node of another (a child run of "wide"), a node a person approves first, and a node over its time
# limit that the graph goes on without.
outer = register_graph(
    Graph("outer", state=Outer)
    .node("inner", graph=wide.graph, reads=["n"], writes=["total"], output=lambda out: {"total": out["total"]})  # type: ignore[attr-defined]
    .node("ship", ship, reads=["total"], writes=["shipped"], requires_approval=True)
    .node("nap", nap, writes=["napped"], timeout_s=0.5, on_failure="skip")
    .edge(START, "inner").edge("inner", "ship").edge("ship", "nap").edge("nap", END))
