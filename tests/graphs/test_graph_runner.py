"""The node runner's core, driven without a broker: steps, loops, maps, joins, retries, fallbacks, failures, and
a record it did not make. The fleet runs the same turns (test_graph_fleet.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentfleet import END, START, Graph, append, register_graph
from agentfleet.agents.registry import Agent
from agentfleet.errors import ErrorCode, ModelError, ToolError
from agentfleet.graphs.binding import GraphModel
from agentfleet.loop.transcript import Message, ModelTurn
from agentfleet.models.base import ModelRequest
from agentfleet.tools.tool import ToolContext


class S(BaseModel):
    x: int
    count: int = 0
    seen: Annotated[list[str], append] = []
    items: list[int] = []
    total: Annotated[list[int], append] = []
    verdict: str = ""


Answer = Callable[[str, dict[str, Any]], dict[str, Any]]  # a tool name, its arguments → the recorded result


def run_node(agent: Agent) -> Answer:
    """Runs a function node's tool as an executor would (bind, call, a ToolError as a failed result)."""
    def answer(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = agent.tools[name]
        ctx = ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=Path("."))
        try:
            return {"ok": True, "output": tool.func(ctx, **tool.bind(arguments))}  # type: ignore[misc]
        except ToolError as exc:
            return {"ok": False, "error_code": exc.code, "message": exc.message}
    return answer


def drive(graph: Graph, goal: dict[str, Any], answer: Answer | None = None,
          steps: int = 50) -> tuple[list[ModelTurn], list[Message]]:
    """The graph's turns until its final answer (or a GraphError, raised), each call answered by ``answer``."""
    agent = register_graph(graph, register=False)
    answer = answer or run_node(agent)
    model, messages, turns = agent.model, [], []
    for iteration in range(steps):
        turn = model.complete(ModelRequest(run_id="r", agent=graph.name, iteration=iteration, goal=goal,
                                           messages=list(messages)))
        turns.append(turn)
        if turn.tool_calls[0].name == "final_answer":
            return turns, messages
        messages.append(turn.as_message())
        messages += [Message(role="tool", tool_call_id=c.id, content=json.dumps(answer(c.name, c.arguments)))
                     for c in turn.tool_calls]
    raise AssertionError("the graph did not finish")


def ran(turns: list[ModelTurn]) -> list[list[str]]:
    return [[c.id.split(".", 3)[3] for c in t.tool_calls] for t in turns[:-1]]


def final(turns: list[ModelTurn]) -> dict[str, Any]:
    return turns[-1].tool_calls[0].arguments


def inc(state: S) -> dict:
    return {"count": state.count + 1, "seen": ["inc"]}


def test_a_loop_runs_until_its_condition_lets_it_out() -> None:
    graph = (Graph("loop", state=S).node("inc", inc, reads=["count"], writes=["count", "seen"])
             .edge(START, "inc").edge("inc", "inc", when=lambda s: s.count < 3, label="count < 3")
             .edge("inc", END, when=lambda s: s.count >= 3, label="done"))
    turns, _ = drive(graph, {"x": 0})
    assert ran(turns) == [["inc"], ["inc"], ["inc"]]
    assert final(turns)["count"] == 3 and final(turns)["seen"] == ["inc"] * 3
    why = json.loads(turns[-1].text or "")["path"][0]["edges"]
    assert {"from": "inc", "to": "END", "took": True, "because": "done"} in why


def test_a_map_runs_once_per_item_in_one_step_and_its_writes_fold_in() -> None:
    graph = (Graph("map", state=S)
             .node("plan", lambda s: {"items": list(range(s.x))}, reads=["x"], writes=["items"])
             .node("square", lambda s, item: {"total": [item * item]}, writes=["total"])
             .node("sum", lambda s: {"count": sum(s.total)}, reads=["total"], writes=["count"])
             .edge(START, "plan").map("plan", "square", over="items").edge("square", "sum").edge("sum", END))
    turns, _ = drive(graph, {"x": 50})
    assert [len(step) for step in ran(turns)] == [1, 50, 1]  # fifty branches, joined once
    assert final(turns)["count"] == sum(i * i for i in range(50))


def test_a_join_waits_for_every_branch_however_long() -> None:
    graph = (Graph("join", state=S)
             .node("a", lambda s: {"seen": ["a"]}, writes=["seen"])
             .node("a2", lambda s: {"seen": ["a2"]}, writes=["seen"])
             .node("b", lambda s: {"seen": ["b"]}, writes=["seen"])
             .node("end", lambda s: {"verdict": ",".join(s.seen)}, reads=["seen"], writes=["verdict"])
             .fan_out(START, ["a", "b"]).edge("a", "a2").join(["a2", "b"], "end").edge("end", END))
    turns, _ = drive(graph, {"x": 0})
    assert ran(turns) == [["a", "b"], ["a2"], ["end"]]
    assert final(turns)["verdict"] == "a,b,a2"


def flaky(fails: int) -> Callable[[S], dict]:
    tries = []

    def node(state: S) -> dict:
        tries.append(1)
        if len(tries) <= fails:
            raise ToolError("down", code=ErrorCode.TRANSIENT)
        return {"verdict": f"after {len(tries)}"}
    return node


def test_a_failed_node_is_tried_again_with_backoff_then_its_fallback_then_the_graph_fails() -> None:
    def build(fails: int, **policy: Any) -> Graph:
        graph = Graph("retry", state=S).node("flaky", flaky(fails), writes=["verdict"], **policy)
        if "fallback" in policy:  # reached by the fallback alone
            graph.node("plan_b", lambda s: {"verdict": "plan b"}, writes=["verdict"]).edge("plan_b", END)
        return graph.edge(START, "flaky").edge("flaky", END)

    turns, _ = drive(build(2, retries=2, backoff_s=0.5), {"x": 0})
    assert final(turns)["verdict"] == "after 3"
    assert [c.arguments["delay_s"] for t in turns[:-1] for c in t.tool_calls] == [0.0, 0.5, 1.0]
    turns, _ = drive(build(5, retries=1, fallback="plan_b"), {"x": 0})
    assert ran(turns) == [["flaky"], ["flaky"], ["plan_b"]] and final(turns)["verdict"] == "plan b"
    with pytest.raises(ModelError) as raised:
        drive(build(5, retries=1), {"x": 0})
    assert raised.value.code == ErrorCode.NODE_FAILED and "'flaky' failed (try 2): TRANSIENT" in str(raised.value)


def test_a_join_does_not_wait_for_a_skipped_branch() -> None:
    graph = (Graph("skipjoin", state=S)
             .node("bad", flaky(9), writes=["verdict"], on_failure="skip")
             .node("good", lambda s: {"seen": ["good"]}, writes=["seen"])
             .node("after", lambda s: {"count": len(s.seen)}, reads=["seen"], writes=["count"])
             .fan_out(START, ["bad", "good"]).join(["bad", "good"], "after").edge("after", END))
    turns, _ = drive(graph, {"x": 0})
    assert ran(turns) == [["bad", "good"], ["after"]] and final(turns)["count"] == 1
    why = json.loads(turns[1].text or "")["path"][0]
    assert why["failed"][0]["then"] == "skip" and {"from": "bad", "to": "after", "took": False, "skipped": True} \
        in why["edges"]


def test_a_branch_that_may_be_skipped_is_and_the_rest_goes_on() -> None:
    graph = (Graph("skip", state=S)
             .node("bad", flaky(9), writes=["verdict"], on_failure="skip")
             .node("good", lambda s: {"seen": ["good"]}, writes=["seen"])
             .fan_out(START, ["bad", "good"]).edge("bad", END).edge("good", END))
    turns, _ = drive(graph, {"x": 0})
    assert final(turns)["seen"] == ["good"] and final(turns)["verdict"] == ""


@pytest.mark.parametrize(("graph", "code", "said"), [
    (Graph("w", state=S).node("n", lambda s: {"verdict": "v", "count": 1}, writes=["verdict"])
     .edge(START, "n").edge("n", END), ErrorCode.NODE_FAILED,
     "UNDECLARED_WRITE: node 'n' wrote 'count', which it does not declare"),
    (Graph("r", state=S).node("n", lambda s: {"verdict": s.verdict}, writes=["verdict"])
     .edge(START, "n").edge("n", END), ErrorCode.NODE_FAILED,
     "UNDECLARED_READ: node 'n' read 'verdict', which it does not declare"),
    (Graph("t", state=S).node("n", lambda s: {"count": "many"}, writes=["count"]).edge(START, "n").edge("n", END),
     ErrorCode.STATE_INVALID, "count: Input should be a valid integer"),
    (Graph("c", state=S).node("a", lambda s: {"verdict": "a"}, writes=["verdict"])
     .node("b", lambda s: {"verdict": "b"}, writes=["verdict"])
     .edge(START, "a", when=lambda s: True).edge(START, "b", when=lambda s: True).edge("a", END).edge("b", END),
     ErrorCode.WRITE_CONFLICT, "a and b wrote 'verdict' in the same step"),
    (Graph("n", state=S).node("a", inc, reads=["count"], writes=["count", "seen"])
     .edge(START, "a").edge("a", END, when=lambda s: s.count > 5), ErrorCode.NO_ROUTE, "after 'a' no edge"),
    (Graph("e", state=S).node("a", inc, reads=["count"], writes=["count", "seen"])
     .edge(START, "a").edge("a", END, when=lambda s: 1 / 0), ErrorCode.NODE_FAILED, "raised ZeroDivisionError"),
])
def test_a_node_that_breaks_the_rules_fails_the_graph_with_its_code(graph: Graph, code: ErrorCode,
                                                                     said: str) -> None:
    with pytest.raises(ModelError) as raised:
        drive(graph, {"x": 0})
    assert raised.value.code == code and said in str(raised.value)


def test_a_record_the_graph_would_not_make_ends_it_graph_changed() -> None:
    graph = Graph("g", state=S).node("a", inc, reads=["count"], writes=["count", "seen"]).edge(START, "a") \
        .edge("a", END)
    _turns, messages = drive(graph, {"x": 0})
    other = Graph("g", state=S).node("b", inc, reads=["count"], writes=["count", "seen"]).edge(START, "b") \
        .edge("b", END)
    with pytest.raises(ModelError) as raised:
        GraphModel(other).complete(ModelRequest(run_id="r", agent="g", iteration=1, goal={"x": 0}, messages=messages))
    assert raised.value.code == ErrorCode.GRAPH_CHANGED


def test_a_result_the_fleet_cannot_read_is_a_failed_node_not_a_crash() -> None:
    graph = Graph("g", state=S).node("a", inc, reads=["count"], writes=["count", "seen"], on_failure="skip") \
        .edge(START, "a").edge("a", END)
    turns, _ = drive(graph, {"x": 0}, answer=lambda name, args: ["not", "a", "result"])  # type: ignore[arg-type,return-value]
    assert final(turns)["count"] == 0


def test_a_fork_starts_at_the_node_it_names_with_the_state_it_is_given() -> None:
    graph = (Graph("loop", state=S).node("inc", inc, reads=["count"], writes=["count", "seen"])
             .node("first", lambda s: {"verdict": "first"}, writes=["verdict"])
             .edge(START, "first").edge("first", "inc")
             .edge("inc", "inc", when=lambda s: s.count < 3).edge("inc", END, when=lambda s: s.count >= 3))
    turns, _ = drive(graph, {"x": 0, "count": 2, "_from": "inc"})
    assert ran(turns) == [["inc"]] and final(turns)["count"] == 3 and final(turns)["verdict"] == ""


# Random graphs: a DAG of nodes 0..n-1, each reached by an edge that always holds from an earlier node, with
# conditional edges on the goal's x to later nodes or END, and an edge to END from any node left without one.
@st.composite
def dags(draw: st.DrawFn) -> tuple[Graph, int]:
    n = draw(st.integers(2, 7))
    graph = Graph("dag", state=S)
    for i in range(n):
        graph.node(f"n{i}", lambda s, i=i: {"seen": [f"n{i}"]}, writes=["seen"])
    graph.edge(START, "n0")
    for i in range(1, n):
        graph.edge(f"n{draw(st.integers(0, i - 1))}", f"n{i}")
    for i in range(n):
        later = [f"n{j}" for j in range(i + 1, n)] + [END]
        for target in draw(st.lists(st.sampled_from(later), max_size=2, unique=True)):
            k = draw(st.integers(0, 3))
            graph.edge(f"n{i}", target, when=lambda s, k=k: (s.x + k) % 3 == 0, label=f"(x + {k}) % 3 == 0")
        if all(e.when is not None for e in graph.out_of(f"n{i}")):  # a way on whatever x is
            graph.edge(f"n{i}", END)
    return graph, draw(st.integers(0, 5))


@settings(max_examples=60, deadline=None)
@given(dags())
def test_every_run_follows_the_edges_ends_once_and_resumes_without_repeating(case: tuple[Graph, int]) -> None:
    graph, x = case
    turns, messages = drive(graph, {"x": x})
    assert sum(t.tool_calls[0].name == "final_answer" for t in turns) == 1  # one end, the last turn
    steps = ran(turns)
    assert steps[0] == ["n0"]
    edges = {(e.source, e.target) for e in graph.edges}
    for before, now in itertools.pairwise(steps):
        for node in now:  # each node of a step is the target of an edge out of a node of the step before
            assert any((b, node) in edges for b in before), (before, now)
    assert final(turns)["seen"] == [n for step in steps for n in step]
    # A resumed run (a new process: a fresh model, the record so far) makes the very next turn, never an earlier one.
    cut = [i for i, m in enumerate(messages) if m.role == "assistant"]
    for iteration, at in enumerate(cut):
        again = GraphModel(graph).complete(ModelRequest(run_id="r", agent="dag", iteration=iteration,
                                                        goal={"x": x}, messages=messages[:at]))
        assert [c.id for c in again.tool_calls] == [c.id for c in turns[iteration].tool_calls]


def test_a_retry_waiting_out_its_backoff_stops_when_its_run_is_cancelled() -> None:
    import time

    graph = Graph("wait", state=S).node("n", inc, reads=["count"], writes=["count", "seen"], retries=1,
                                        backoff_s=30).edge(START, "n").edge("n", END)
    agent = register_graph(graph, register=False)
    tool = agent.tools["node_n"]
    cancelled = ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=Path("."),
                            cancel_check=lambda: True)  # the run's stop mark, as the executor reads it from Redis
    started = time.monotonic()
    with pytest.raises(ToolError) as raised:
        tool.func(cancelled, **tool.bind({"state": {"count": 0}, "attempt": 2, "delay_s": 30.0}))  # type: ignore[misc]
    assert raised.value.code == ErrorCode.CANCELLED and time.monotonic() - started < 5
