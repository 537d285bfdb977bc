"""A graph as a Mermaid flowchart (``agentfleet graph show NAME``): nodes by kind, edges with their conditions,
maps and joins as such. Renders in GitHub, GitLab and most docs tools."""

from __future__ import annotations

from agentfleet.graphs.definition import END, START, Graph

SHAPES = {"function": ("[", "]"), "tool": ("[[", "]]"), "agent": ("([", "])")}


def mermaid(graph: Graph) -> str:
    lines = ["flowchart TD", f"    {_id(START)}((start))", f"    {_id(END)}((end))"]
    for node in graph.nodes.values():
        left, right = SHAPES[node.kind]
        kind = {"function": "", "tool": f" · tool {node.tool.name if node.tool else ''}",
                "agent": f" · agent {node.agent}"}[node.kind]
        lines.append(f'    {_id(node.name)}{left}"{_text(node.name + kind)}"{right}')
    for edge in graph.edges:
        said = [edge.describe()] if edge.describe() else []
        if edge.each:
            said.append(f"each {edge.each}")
        if edge.join:
            said.append(f"join {' + '.join(edge.join)}")
        arrow = "-.->" if edge.when is not None else "==>" if edge.each else "-->"
        label = f'|"{_text(", ".join(said))}"|' if said else ""
        lines.append(f"    {_id(edge.source)} {arrow}{label} {_id(edge.target)}")
    return "\n".join(lines) + "\n"


def _id(name: str) -> str:
    return {START: "START", END: "END"}.get(name, f"n_{name}")


def _text(text: str) -> str:
    return text.replace('"', "#quot;")
