"""A graph as data: nodes, conditional edges, joins and maps over typed state, built step by step.

    graph = (Graph("fix_loop", state=FixState)
             .node("check", check, reads=["source"], writes=["errors", "report"])
             .node("fix", agent="fixer", reads=["source", "report"], writes=["source"])
             .edge(START, "check")
             .edge("check", "fix", when=lambda s: s.errors > 0, label="errors > 0")
             .edge("check", END, when=lambda s: s.errors == 0, label="clean")
             .edge("fix", "check"))

Building records; graphs/validation.py judges, and ``register_graph`` (graphs/binding.py) refuses a graph with
any problem. How it runs is the runner's business (graphs/runner.py), as a Temporal activity's decorator attaches
data and its worker decides. A node is a Python function (run by an executor, as a tool of the graph), a
declared ``Tool``, an agent (a delegated child run whose spend counts in the graph's budget) or another graph
(the same: a graph is an agent).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from agentfleet.errors import ConfigurationError
from agentfleet.graphs.state import Reducer, reducers_of, required_fields
from agentfleet.loop.budgets import Limits

if TYPE_CHECKING:
    from agentfleet.tools.tool import Tool  # a tool node holds one; the definition never runs it

START = "__start__"
END = "__end__"
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,47}$")  # a node's name goes into call ids and tool names
Condition = Callable[[Any], bool]
FailurePolicy = Literal["fail", "skip", "fallback"]


@dataclass(frozen=True)
class NodePolicy:
    """What happens when a node fails. ``retries``: further tries, the n-th after ``backoff_s * 2**(n-1)`` seconds
    (at most ``max_backoff_s``; the wait is spent in the executor that runs the try, and a cancel ends it);
    ``timeout_s``: each try's limit (function and tool nodes; an agent node has its agent's limits);
    ``fallback``: a node run instead once the tries are spent; ``on_failure``: then ``"fail"`` the graph,
    ``"skip"`` the branch (its writes and edges are dropped, the rest goes on) or take the ``"fallback"``
    (the default when one is named); ``requires_approval``: a person approves each try first (function and
    tool nodes; the fleet's approvals)."""

    retries: int = 0
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    timeout_s: float | None = None
    fallback: str | None = None
    on_failure: FailurePolicy | None = None
    requires_approval: bool = False

    @property
    def after_failure(self) -> FailurePolicy:
        return self.on_failure or ("fallback" if self.fallback else "fail")

    def delay_s(self, attempt: int) -> float:
        """The wait before try ``attempt`` (2, 3, …)."""
        return 0.0 if attempt <= 1 else min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 2))


@dataclass(frozen=True)
class Node:
    """One node. ``func(state)`` (or ``func(state, item)`` under a map) returns the fields it writes; ``tool``,
    ``agent`` and ``graph`` nodes take their arguments or goal input from ``input(state)`` (default: the fields
    read) and write what ``output(result)`` returns (default: the result's fields that the node writes)."""

    name: str
    kind: Literal["function", "tool", "agent"]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    func: Callable[..., Any] | None = None
    tool: Tool | None = None
    agent: str | None = None
    input: Callable[..., dict[str, Any]] | None = None
    output: Callable[[Any], dict[str, Any]] | None = None
    policy: NodePolicy = field(default_factory=NodePolicy)
    description: str = ""


@dataclass(frozen=True)
class Edge:
    """``source`` → ``target`` when ``when(state)`` holds (always, without one). ``each``: a map (LangGraph's
    ``Send``): the target runs once per item of that list field, in parallel, each try given its item. ``join``:
    the target waits for every source of its join before it runs once."""

    source: str
    target: str
    when: Condition | None = None
    label: str | None = None
    each: str | None = None
    join: tuple[str, ...] = ()

    def describe(self) -> str:
        said = self.label or (getattr(self.when, "__name__", "condition") if self.when is not None else "")
        return "" if said == "<lambda>" else said


class Graph:
    """A graph of nodes over a pydantic ``state``; ``inputs``: the fields a goal gives (default: the state's
    required fields; a goal may give any field). Started by a goal on ``goal.<name>`` like an agent, it ends
    with the state as its output (``output``: only these fields)."""

    def __init__(self, name: str, *, state: type[BaseModel], description: str = "",
                 inputs: Sequence[str] | None = None, output: Sequence[str] | None = None,
                 limits: Limits | None = None) -> None:
        if not (isinstance(state, type) and issubclass(state, BaseModel)):
            raise ConfigurationError(f"graph {name!r}: state must be a pydantic model class")
        if not NAME.match(name or ""):
            raise ConfigurationError(f"graph name {name!r} must be a letter then letters, digits, '_' or '-'")
        self.name = name
        self.state = state
        self.description = description or (state.__doc__ or "").strip().split("\n\n")[0]
        self.inputs: tuple[str, ...] = tuple(inputs) if inputs is not None else tuple(required_fields(state))
        self.output: tuple[str, ...] = tuple(output) if output is not None else tuple(state.model_fields)
        self.reducers: dict[str, Reducer] = reducers_of(state)
        self.limits = limits or Limits(max_steps=100, max_calls_per_turn=200)
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []
        self.repeated: list[str] = []  # names declared twice (a problem, said when the graph is checked)

    # Building.

    def node(self, name: str, func: Callable[..., Any] | None = None, *, tool: Tool | None = None,
             agent: str | None = None, graph: Graph | None = None, reads: Sequence[str] = (),
             writes: Sequence[str] = (), input: Callable[..., dict[str, Any]] | None = None,
             output: Callable[[Any], dict[str, Any]] | None = None, retries: int = 0, backoff_s: float = 1.0,
             max_backoff_s: float = 60.0, timeout_s: float | None = None, fallback: str | None = None,
             on_failure: FailurePolicy | None = None, requires_approval: bool = False,
             description: str = "") -> Graph:
        """Add a node: exactly one of ``func``, ``tool``, ``agent`` (an agent's name) or ``graph``."""
        given = [k for k, v in (("func", func), ("tool", tool), ("agent", agent), ("graph", graph)) if v is not None]
        if len(given) != 1:
            raise ConfigurationError(f"graph {self.name!r}: node {name!r} takes one of func, tool, agent or graph "
                                     f"(got {', '.join(given) or 'none'})")
        if name in self.nodes or name in (START, END):
            self.repeated.append(name)
            return self
        if not isinstance(retries, int) or retries < 0 or backoff_s < 0 or max_backoff_s < 0 \
                or (timeout_s is not None and timeout_s <= 0):
            raise ConfigurationError(f"graph {self.name!r}: node {name!r}: retries, backoff_s and max_backoff_s are "
                                     "at least 0, timeout_s above 0")
        policy = NodePolicy(retries, backoff_s, max_backoff_s, timeout_s, fallback, on_failure, requires_approval)
        kind: Literal["function", "tool", "agent"] = "function" if func else "tool" if tool else "agent"
        about = description or (getattr(func, "__doc__", None) or "").strip().split("\n\n")[0]
        self.nodes[name] = Node(name, kind, tuple(reads), tuple(writes), func=func, tool=tool,
                                agent=graph.name if graph is not None else agent, input=input, output=output,
                                policy=policy, description=about)
        return self

    def edge(self, source: str, target: str, *, when: Condition | None = None, label: str | None = None,
             each: str | None = None) -> Graph:
        """``source`` → ``target``, when ``when(state)`` holds; ``each``: once per item of that list field."""
        if when is not None and not callable(when):
            raise ConfigurationError(f"graph {self.name!r}: edge {source} → {target}: when takes a function of "
                                     "the state")
        self.edges.append(Edge(source, target, when, label, each))
        return self

    def fan_out(self, source: str, targets: Sequence[str]) -> Graph:
        """``source`` → each of ``targets``, in parallel."""
        for target in targets:
            self.edge(source, target)
        return self

    def map(self, source: str, target: str, *, over: str, when: Condition | None = None,
            label: str | None = None) -> Graph:
        """``target`` once per item of the list field ``over``, in parallel (its writes need reducers)."""
        return self.edge(source, target, when=when, label=label, each=over)

    def join(self, sources: Sequence[str], target: str) -> Graph:
        """``target`` runs once every one of ``sources`` has finished (each branch's last node)."""
        together = tuple(sources)
        for source in together:
            self.edges.append(Edge(source, target, join=together))
        return self

    # Reading.

    def out_of(self, source: str) -> list[Edge]:
        return [e for e in self.edges if e.source == source]

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, {len(self.edges)} edges)"
