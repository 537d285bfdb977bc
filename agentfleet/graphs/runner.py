"""The node runner's core: from a graph, its goal and the steps its run has recorded, what runs next. Pure.

A graph run moves in steps (a superstep, as LangGraph and Pregel call it): every node due runs, in parallel;
their writes merge into the state (reducers, or one writer a field); then every edge out of a node that
finished is judged on the new state, and what they lead to is the next step. Each step is one iteration of the
fleet's loop: its nodes are the turn's calls (checkpointed, run by executors or as child runs), their results
the observation; so a graph resumes after a crash without repeating a finished node, and its steps are
replayed from the record, never from a guess.

The position is worked out again each step from the run's record (the calls each step made and their results),
not from a state kept aside: what was recorded is the truth. A record that the graph, as loaded, would not have
made (it changed under a running run) ends the run ``GRAPH_CHANGED`` rather than wander.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentfleet.errors import ErrorCode
from agentfleet.graphs.definition import END, START, Edge, Graph, Node
from agentfleet.graphs.state import WriteConflict, apply_writes, validated, view

FROM_KEY = "_from"  # a goal's input may start the graph at a node: {"_from": "fix", ...the state as it was}


class GraphFailed(Exception):
    """The graph cannot go on: a node failed with no policy to carry on, a write broke the state, no edge held."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Activation:
    """One try of one node in one step; ``item``: its item under a map (``has_item``)."""

    node: str
    attempt: int = 1
    item: Any = None
    has_item: bool = False

    def call_id(self, step: int, index: int) -> str:
        return f"{step}.{index}.{self.attempt}.{self.node}"


@dataclass(frozen=True)
class Outcome:
    """What a try came to: the fields it wrote, or why it failed."""

    writes: Mapping[str, Any] | None = None
    code: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.writes is not None


@dataclass
class Position:
    """Where a run of the graph is: its state, what runs next, the joins partly arrived, and how the last step
    got here (its nodes, each edge judged, each failure), for the trace (kept per turn, not per run: a position
    stays the same size however long the run)."""

    state: dict[str, Any]
    due: list[Activation]
    arrived: dict[str, set[str]] = field(default_factory=dict)
    path: list[dict[str, Any]] = field(default_factory=list)


def start(graph: Graph, goal: Mapping[str, Any]) -> Position:
    """The first step: the goal's fields as the state, and the nodes START's edges lead to (or the node a fork
    starts from)."""
    values = {k: v for k, v in goal.items() if k != FROM_KEY}
    state, problem = validated(graph.state, values)
    if state is None:
        raise GraphFailed(ErrorCode.INPUT_INVALID, f"the goal does not make a {graph.state.__name__}: {problem}")
    began = goal.get(FROM_KEY)
    if began is not None:
        if began not in graph.nodes:
            raise GraphFailed(ErrorCode.INPUT_INVALID, f"{FROM_KEY} names {began!r}, which is not a node")
        return Position(state, [Activation(began)], path=[{"step": "start", "from": began}])
    position = Position(state, [])
    position.due, judged = _follow(graph, [START], state, position.arrived)
    position.path.append({"step": "start", "edges": judged})
    return position


def advance(graph: Graph, position: Position, step: int, results: Mapping[str, Outcome]) -> Position:
    """The position after ``step``, whose tries (``position.due``) came to ``results`` (by call id)."""
    due = position.due
    outcomes = [(a, results.get(a.call_id(step, i))) for i, a in enumerate(due)]
    finished: list[str] = []
    writes: list[tuple[str, Mapping[str, Any]]] = []
    again: list[Activation] = []
    failed: list[dict[str, Any]] = []
    skipped: list[str] = []  # branches dropped: a join they lead to no longer waits for them
    for i, (activation, outcome) in enumerate(outcomes):
        node = graph.nodes[activation.node]
        if outcome is None:
            outcome = Outcome(code=ErrorCode.INTERNAL, message="no result was recorded for this node")
        if outcome.ok:
            assert outcome.writes is not None
            undeclared = sorted(set(outcome.writes) - set(node.writes))
            if undeclared:
                outcome = Outcome(code=ErrorCode.UNDECLARED_WRITE,
                                  message=f"node {node.name!r} wrote {', '.join(map(repr, undeclared))}, which it "
                                          f"does not declare (writes={list(node.writes)})")
        if outcome.ok:
            assert outcome.writes is not None
            writes.append((f"{node.name}#{i}" if activation.has_item else node.name, outcome.writes))
            if node.name not in finished:
                finished.append(node.name)
            continue
        said = {"node": node.name, "attempt": activation.attempt, "error_code": outcome.code,
                "message": outcome.message}
        policy = node.policy
        if activation.attempt <= policy.retries:
            again.append(Activation(node.name, activation.attempt + 1, activation.item, activation.has_item))
            failed.append({**said, "then": "retry"})
        elif policy.after_failure == "fallback" and policy.fallback is not None:
            again.append(Activation(policy.fallback, 1, activation.item, activation.has_item))
            failed.append({**said, "then": f"fallback {policy.fallback}"})
        elif policy.after_failure == "skip":
            failed.append({**said, "then": "skip"})
            skipped.append(node.name)
        else:
            raise GraphFailed(ErrorCode.NODE_FAILED, f"node {node.name!r} failed (try {activation.attempt}): "
                                                     f"{outcome.code}: {outcome.message}")
    try:
        merged = apply_writes(position.state, writes, graph.reducers)
    except WriteConflict as exc:
        raise GraphFailed(ErrorCode.WRITE_CONFLICT, str(exc)) from None
    state, problem = validated(graph.state, merged)
    if state is None:
        raise GraphFailed(ErrorCode.STATE_INVALID, f"step {step}'s writes ({', '.join(w for w, _ in writes)}) "
                                                   f"break the state: {problem}")
    arrived = {k: set(v) for k, v in position.arrived.items()}
    nxt, judged = _follow(graph, finished, state, arrived, skipped)
    record: dict[str, Any] = {"step": step, "ran": [a.node for a in due], "edges": judged}
    if failed:
        record["failed"] = failed
    # A node due again (a retry, a fallback) and by an edge runs once.
    due_next = [*again, *(a for a in nxt if a.has_item or all(b.node != a.node for b in again))]
    return Position(state, due_next, arrived, [record])


def _follow(graph: Graph, finished: Sequence[str], state: dict[str, Any], arrived: dict[str, set[str]],
            skipped: Sequence[str] = ()) -> tuple[list[Activation], list[dict[str, Any]]]:
    """The next step's tries from the edges out of ``finished``, judged on ``state``; and what each edge said. A
    ``skipped`` branch follows no edge, but counts as arrived at the joins it leads to."""
    shown = graph.state.model_validate(state)
    due: list[Activation] = []
    judged: list[dict[str, Any]] = []
    for source in skipped:
        for e in graph.out_of(source):
            if not e.join:
                continue
            arrived.setdefault(e.target, set()).add(source)
            said: dict[str, Any] = {"from": _name(source), "to": _name(e.target), "took": False, "skipped": True}
            judged.append(said)
            if set(e.join) <= arrived[e.target]:  # the rest goes on, even if every branch was dropped
                arrived.pop(e.target)
                if all(a.node != e.target for a in due):
                    due.append(Activation(e.target))
    for source in finished:
        edges = graph.out_of(source)
        took = 0
        for e in edges:
            held = _holds(e, shown)
            said: dict[str, Any] = {"from": _name(e.source), "to": _name(e.target), "took": held}
            if e.describe():
                said["because"] = e.describe()
            judged.append(said)
            if not held:
                continue
            took += 1
            if e.target == END:
                continue
            if e.join:
                arrived.setdefault(e.target, set()).add(source)
                if not set(e.join) <= arrived[e.target]:
                    said["waiting_for"] = sorted(set(e.join) - arrived[e.target])
                    continue
                arrived.pop(e.target)
            if e.each is not None:
                items = state.get(e.each) or []
                due += [Activation(e.target, 1, item, True) for item in items]
                said["items"] = len(items)
            elif all(a.node != e.target or a.has_item for a in due):
                due.append(Activation(e.target))
        if edges and not took:
            raise GraphFailed(ErrorCode.NO_ROUTE, f"after {_name(source)!r} no edge's condition held "
                                                  f"({', '.join(_arrow(e) for e in edges)})")
    return due, judged


def _holds(edge: Edge, state: Any) -> bool:
    if edge.when is None:
        return True
    try:
        return bool(edge.when(state))
    except Exception as exc:  # a user's condition: its failure is the run's, with its words
        raise GraphFailed(ErrorCode.NODE_FAILED, f"the condition of edge {_arrow(edge)} raised "
                                                 f"{type(exc).__name__}: {exc}") from None


def node_input(node: Node, state: dict[str, Any], graph: Graph, activation: Activation) -> dict[str, Any]:
    """A tool node's arguments or an agent node's goal input: ``input(state[, item])``, else the fields read."""
    if node.input is None:
        given = {name: state.get(name) for name in node.reads}
        return {**given, "item": activation.item} if activation.has_item else given
    shown = view(graph.state, state, node.reads)
    made = node.input(shown, activation.item) if takes_item(node.input) else node.input(shown)
    if not isinstance(made, dict):
        raise GraphFailed(ErrorCode.NODE_FAILED, f"node {node.name!r}: input(...) returned "
                                                 f"{type(made).__name__}, not a dict")
    return json.loads(json.dumps(made, default=str))  # what goes on the wire, as it will be read back


def takes_item(fn: Any) -> bool:
    """Whether a node's function (or ``input``) takes a map's item: a second parameter named ``item`` or without a
    default (``lambda s, k=k: …`` binds a loop variable, it takes no item)."""
    params = list(inspect.signature(fn).parameters.values())[1:2]
    return bool(params) and (params[0].name == "item" or params[0].default is inspect.Parameter.empty)


def node_writes(node: Node, output: Any) -> Outcome:
    """The fields a tool or agent node writes from what it returned: ``output(result)``, else the result's fields
    that the node writes (an agent's output, a tool's dict)."""
    if node.output is not None:
        try:
            made = node.output(output)
        except Exception as exc:
            return Outcome(code=ErrorCode.NODE_FAILED, message=f"output(...) raised {type(exc).__name__}: {exc}")
        if not isinstance(made, dict):
            return Outcome(code=ErrorCode.NODE_FAILED, message=f"output(...) returned {type(made).__name__}")
        return Outcome(writes=made)
    if not isinstance(output, dict):
        return Outcome(code=ErrorCode.NODE_FAILED, message=f"the node returned {type(output).__name__}, not the "
                                                           "fields it writes")
    return Outcome(writes=output if node.kind == "function" else {k: v for k, v in output.items()
                                                                   if k in node.writes})


def _name(node: str) -> str:
    return {START: "START", END: "END"}.get(node, node)


def _arrow(edge: Edge) -> str:
    because = f" when {edge.describe()}" if edge.describe() else ""
    return f"{_name(edge.source)} → {_name(edge.target)}{because}"
