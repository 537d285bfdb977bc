"""What is wrong with a graph, each fault in a sentence of its own, found before it ever runs.

Checked: names; fields read or written that the state lacks; a read of a field nothing writes; edges from or to
nowhere; nodes no path reaches; nodes with no edge out; parallel writers of one field without a reducer (where
the parallelism is certain: a fan-out of unconditional edges, a map); a cycle with no way out, or whose edges
all always hold; fallbacks and joins that name no node. What cannot be known here (two conditional edges that
both hold) is refused when it happens (graphs/runner.py).
"""

from __future__ import annotations

import typing
from collections.abc import Iterable

from agentfleet.errors import ConfigurationError
from agentfleet.graphs.definition import END, NAME, START, Graph


def check(graph: Graph) -> None:
    """Raise ``ConfigurationError`` listing every problem of ``graph``, if it has one."""
    found = problems(graph)
    if found:
        raise ConfigurationError(f"graph {graph.name!r} is not valid:\n  - " + "\n  - ".join(found))


def problems(graph: Graph) -> list[str]:
    found = [f"node {name!r} is declared twice" for name in dict.fromkeys(graph.repeated)]
    fields = set(graph.state.model_fields)
    nodes = graph.nodes
    for name, node in nodes.items():
        if not NAME.match(name):
            found.append(f"node name {name!r} must be a letter then letters, digits, '_' or '-' (48 at most)")
        for verb, names in (("reads", node.reads), ("writes", node.writes)):
            missing = [f for f in names if f not in fields]
            if missing:
                found.append(f"node {name!r} {verb} {_names(missing)}, which the state "
                             f"{graph.state.__name__} does not have")
        if node.kind == "agent" and not (isinstance(node.agent, str) and NAME.match(node.agent)):
            found.append(f"node {name!r} names agent {node.agent!r}, which is not an agent's name")
        policy = node.policy
        if policy.fallback is not None and policy.fallback not in nodes:
            found.append(f"node {name!r} falls back to {policy.fallback!r}, which is not a node")
        if policy.fallback == name:
            found.append(f"node {name!r} falls back to itself")
        if policy.on_failure == "fallback" and policy.fallback is None:
            found.append(f"node {name!r} takes its fallback on failure but names none (fallback=...)")
    for verb, names in (("inputs", graph.inputs), ("output", graph.output)):
        missing = [f for f in names if f not in fields]
        if missing:
            found.append(f"the graph's {verb} name {_names(missing)}, which the state does not have")
    written = set(graph.inputs) | {f for n in nodes.values() for f in n.writes}
    for name, node in nodes.items():
        unwritten = [f for f in node.reads if f in fields and f not in written]
        if unwritten:
            found.append(f"node {name!r} reads {_names(unwritten)}, which no node writes and no goal gives "
                         "(add it to inputs=[...] or to a node's writes)")
    found += _edge_problems(graph)
    if not any(p.startswith("edge") for p in found):  # the shape is judged on edges that lead somewhere
        found += _shape_problems(graph)
    return found


def _edge_problems(graph: Graph) -> list[str]:
    found: list[str] = []
    nodes, fields = graph.nodes, graph.state.model_fields
    for e in graph.edges:
        arrow = f"{_show(e.source)} → {_show(e.target)}"
        if e.source == END:
            found.append(f"edge {arrow} leaves END: END has no edges out")
        elif e.source != START and e.source not in nodes:
            found.append(f"edge {arrow} comes from nowhere: there is no node {e.source!r}")
        if e.target == START:
            found.append(f"edge {arrow} goes into START: nothing goes back to the start")
        elif e.target != END and e.target not in nodes:
            found.append(f"edge {arrow} goes nowhere: there is no node {e.target!r}")
        if e.each is not None:
            if e.each not in fields:
                found.append(f"edge {arrow} maps over {e.each!r}, which the state does not have")
            elif typing.get_origin(fields[e.each].annotation) not in (list, tuple, typing.Sequence) \
                    and fields[e.each].annotation not in (list, tuple):
                found.append(f"edge {arrow} maps over {e.each!r}, which is not a list field")
            if e.target in nodes:
                plain = [f for f in nodes[e.target].writes if f not in graph.reducers]
                if plain:
                    found.append(f"edge {arrow} runs {e.target!r} once per item of {e.each!r}, in parallel, and "
                                 f"it writes {_names(plain)} without a reducer (Annotated[..., append] or another)")
        if e.join and len(e.join) < 2:
            found.append(f"the join into {e.target!r} has one source: a plain edge does that")
    if not any(e.source == START for e in graph.edges):
        found.append("nothing starts the graph: add .edge(START, <first node>)")
    return found


def _shape_problems(graph: Graph) -> list[str]:
    found: list[str] = []
    nodes = graph.nodes
    reached = _reachable(graph, [START])
    for name in nodes:
        if name not in reached:
            found.append(f"node {name!r} is unreachable: no path from START leads to it")
        elif not graph.out_of(name):
            found.append(f"node {name!r} has no edge out: add .edge({name!r}, END) if the graph ends there")
    # Parallel writers: each unconditional fan-out's branches, up to where they join again.
    for source in [START, *nodes]:
        targets = [e.target for e in graph.out_of(source) if e.when is None and e.each is None and not e.join]
        branches = [t for t in dict.fromkeys(targets) if t in nodes]
        if len(branches) < 2:
            continue
        writers: dict[str, str] = {}
        for branch in branches:
            for node in sorted(_branch(graph, branch, set(branches) - {branch})):
                for f in nodes[node].writes:
                    if f in graph.reducers:
                        continue
                    if f in writers and writers[f] != branch:
                        found.append(f"{_show(source)} fans out to {writers[f]!r} and {branch!r} in parallel and "
                                     f"both branches write {f!r}, which declares no reducer "
                                     "(Annotated[..., append] or another)")
                    writers.setdefault(f, branch)
    for cycle in _cycles(graph):
        inside = set(cycle)
        internal = [e for e in graph.edges if e.source in inside and e.target in inside]
        leaving = [e for e in graph.edges if e.source in inside and e.target not in inside]
        shown = " → ".join(repr(n) for n in [*cycle, cycle[0]])
        if not leaving:
            found.append(f"the cycle {shown} has no way out: no edge leaves it")
        elif all(e.when is None and e.each is None for e in internal):
            found.append(f"the cycle {shown} has no exit condition: every edge on it always holds, so it never "
                         "stops (give the edge back into it a when=...)")
    return found


def _reachable(graph: Graph, start: Iterable[str]) -> set[str]:
    """Nodes a path reaches from ``start``: by edges, and by a fallback from a node reached."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        at = todo.pop()
        node = graph.nodes.get(at)
        fallback = [node.policy.fallback] if node is not None and node.policy.fallback else []
        for target in [e.target for e in graph.out_of(at)] + fallback:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _branch(graph: Graph, first: str, others: set[str]) -> set[str]:
    """The nodes of the branch starting at ``first``, up to (not into) a join, END or a sibling branch."""
    seen, todo = {first}, [first]
    while todo:
        at = todo.pop()
        for e in graph.out_of(at):
            if e.join or e.target in seen or e.target in others or e.target not in graph.nodes:
                continue
            seen.add(e.target)
            todo.append(e.target)
    return seen


def _cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected parts of the graph that hold a cycle, each in declaration order (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    parts: list[list[str]] = []
    order = list(graph.nodes)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for e in graph.out_of(v):
            w = e.target
            if w not in graph.nodes:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 or any(e.target == v for e in graph.out_of(v)):
                parts.append(sorted(part, key=order.index))

    for v in order:
        if v not in index:
            visit(v)
    return parts


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _show(name: str) -> str:
    return {START: "START", END: "END"}.get(name, repr(name))

