"""The tool decorator records data and the harness decides how to run it (issue "Rooms that match the design",
item 2): no package module imports another in a circle, counting imports inside functions too, as an import
contract does. (The whole layered contract comes with the regrouped tree.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agentfleet"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """What a module imports, as import-linter counts it: ``from pkg import mod`` is ``pkg.mod``, not ``pkg``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentfleet"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("agentfleet"))
    return found


def module_graph() -> dict[str, set[str]]:
    paths = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    names = set(paths)
    return {name: {m for m in imports_of(path, names) if m in names and m != name} for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_tool_decorator_builds_no_runner_and_the_harness_has_no_import_circle() -> None:
    harness = {k: {m for m in v if m.startswith("agentfleet.harness")} for k, v in module_graph().items()
               if k.startswith("agentfleet.harness")}
    assert cycles(harness) == []
    assert "agentfleet.tools.manifest" not in module_graph()["agentfleet.tools.tool"]
