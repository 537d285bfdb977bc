"""Every malformed graph is refused when it is built, each fault with a message of its own (graphs/validation.py)."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel

from agentfleet import END, START, Graph, append, register_graph
from agentfleet.errors import ConfigurationError
from agentfleet.graphs import check, problems


class S(BaseModel):
    text: str
    count: int = 0
    notes: Annotated[list[str], append] = []
    items: list[str] = []
    verdict: str = ""


def f(state: S) -> dict:
    return {}


def fine() -> Graph:
    return (Graph("fine", state=S).node("a", f, reads=["text"], writes=["count"]).node("b", f, reads=["count"])
            .edge(START, "a").edge("a", "b").edge("b", END))


def test_a_sound_graph_has_no_problems() -> None:
    assert problems(fine()) == []


def said(graph: Graph) -> str:
    return "\n".join(problems(graph))


@pytest.mark.parametrize(("build", "message"), [
    (lambda g: g.node("c", f, reads=["nope"]).edge("b", "c").edge("c", END),
     "node 'c' reads 'nope', which the state S does not have"),
    (lambda g: g.node("c", f, writes=["nope"]).edge("b", "c").edge("c", END),
     "node 'c' writes 'nope', which the state S does not have"),
    (lambda g: g.node("c", f, reads=["verdict"]).edge("b", "c").edge("c", END),
     "node 'c' reads 'verdict', which no node writes and no goal gives"),
    (lambda g: g.edge("b", "ghost"), "edge 'b' → 'ghost' goes nowhere: there is no node 'ghost'"),
    (lambda g: g.edge("ghost", "b"), "edge 'ghost' → 'b' comes from nowhere: there is no node 'ghost'"),
    (lambda g: g.edge("b", START), "edge 'b' → START goes into START"),
    (lambda g: g.edge(END, "a"), "edge END → 'a' leaves END"),
    (lambda g: g.node("island", f).edge("island", END), "node 'island' is unreachable: no path from START"),
    (lambda g: g.node("c", f).edge("b", "c"), "node 'c' has no edge out: add .edge('c', END)"),
    (lambda g: g.node("c", f, writes=["verdict"]).node("d", f, writes=["verdict"]).fan_out("b", ["c", "d"])
     .edge("c", END).edge("d", END),
     "'b' fans out to 'c' and 'd' in parallel and both branches write 'verdict', which declares no reducer"),
    (lambda g: g.node("c", f, writes=["verdict"]).map("b", "c", over="items").edge("c", END),
     "runs 'c' once per item of 'items', in parallel, and it writes 'verdict' without a reducer"),
    (lambda g: g.node("c", f).map("b", "c", over="text").edge("c", END), "maps over 'text', which is not a list"),
    (lambda g: g.node("c", f).node("d", f).edge("b", "c").edge("c", "d").edge("d", "c"),
     "the cycle 'c' → 'd' → 'c' has no way out: no edge leaves it"),
    (lambda g: g.node("c", f).node("d", f).edge("b", "c").edge("c", "d").edge("d", "c").edge("d", END),
     "the cycle 'c' → 'd' → 'c' has no exit condition: every edge on it always holds"),
    (lambda g: g.node("c", f, fallback="ghost").edge("b", "c").edge("c", END),
     "node 'c' falls back to 'ghost', which is not a node"),
    (lambda g: g.node("c", f, on_failure="fallback").edge("b", "c").edge("c", END),
     "node 'c' takes its fallback on failure but names none"),
    (lambda g: g.node("a", f), "node 'a' is declared twice"),
    (lambda g: g.node("c", agent="no such!").edge("b", "c").edge("c", END), "names agent 'no such!'"),
    (lambda g: g.node("c", f).join(["b"], "c").edge("c", END), "the join into 'c' has one source"),
])
def test_each_malformed_graph_is_refused_with_its_own_message(build, message: str) -> None:  # type: ignore[no-untyped-def]
    graph = fine()
    build(graph)
    assert message in said(graph)
    with pytest.raises(ConfigurationError, match="is not valid"):
        check(graph)


def test_a_graph_with_no_start_says_so() -> None:
    graph = Graph("g", state=S).node("a", f).edge("a", END)
    assert "nothing starts the graph: add .edge(START, <first node>)" in said(graph)


def test_a_cycle_with_a_condition_on_it_is_fine() -> None:
    graph = fine().node("c", f, reads=["count"], writes=["count"]).edge("b", "c").edge("c", "b",
                                                                                      when=lambda s: s.count < 3)
    graph.edges.remove(next(e for e in graph.edges if e.source == "b" and e.target == END))
    graph.edge("c", END, when=lambda s: s.count >= 3)
    assert problems(graph) == []


def test_a_node_takes_exactly_one_kind_and_names_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="takes one of func, tool, agent or graph"):
        Graph("g", state=S).node("a", f, agent="x")
    with pytest.raises(ConfigurationError, match="takes one of func, tool, agent or graph"):
        Graph("g", state=S).node("a")
    with pytest.raises(ConfigurationError, match="graph name"):
        Graph("no spaces", state=S)
    with pytest.raises(ConfigurationError, match="pydantic model"):
        Graph("g", state=dict)  # type: ignore[arg-type]
    assert "node name 'a.b'" in said(fine().node("a.b", f).edge("b", "a.b").edge("a.b", END))


def test_register_refuses_a_graph_with_problems_listing_every_one() -> None:
    graph = fine().edge("b", "ghost").node("island", f)
    with pytest.raises(ConfigurationError) as raised:
        register_graph(graph, register=False)
    assert "ghost" in str(raised.value) and "declared twice" not in str(raised.value)
