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
