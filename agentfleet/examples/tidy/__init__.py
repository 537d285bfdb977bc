"""tidy: a graph on the fleet (issue 25). Lint a text; while it has problems, an agent fixes it and it is linted
again; once clean, its lines and words are counted in parallel and joined into a report.

    START → lint ─(problems)→ fix [agent tidier] → lint … ─(clean)→ count_lines ┐
                                                         └(clean)→ count_words ┴ join → report → END

Each node is a checkpointed step: a killed worker costs the node it was running, never a finished one.
``agentfleet graph show tidy`` draws it.
"""

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel

from agentfleet import END, START, Agent, Graph, Limits, ReplayModel, append, register_graph, tool

MAX_LINE = 79


class TidyState(BaseModel):
    """A text tidied until its lint is clean, then measured."""

    source: str
    problems: list[str] = []
    fixes: Annotated[list[str], append] = []  # every fix made, in order, over all rounds
    lines: int = 0
    words: int = 0
    report: str = ""


def lint(state: TidyState) -> dict:
    """Find tabs, trailing spaces, over-long lines and a missing final newline."""
    problems = []
    for number, line in enumerate(state.source.split("\n"), start=1):
        if "\t" in line:
            problems.append(f"line {number}: a tab")
        if line != line.rstrip():
            problems.append(f"line {number}: trailing spaces")
        if len(line) > MAX_LINE:
            problems.append(f"line {number}: {len(line)} characters (at most {MAX_LINE})")
    if state.source and not state.source.endswith("\n"):
        problems.append("no newline at the end")
    return {"problems": problems}


@tool(read_only=True)
def tidy_text(source: str) -> dict:
    """Replace tabs by four spaces, strip trailing spaces and end the text with a newline; report what changed."""
    fixed, out = [], []
    for number, line in enumerate(source.split("\n"), start=1):
        tidy = line.replace("\t", "    ").rstrip()
        if tidy != line:
            fixed.append(f"line {number}")
        out.append(tidy)
    text = "\n".join(out).rstrip("\n") + "\n"
    if not source.endswith("\n"):
        fixed.append("final newline")
    return {"source": text, "fixed": fixed}


class Tidied(BaseModel):
    source: str
    fixed: list[str]


tidier = Agent(
    "tidier",
    instructions="Tidy the goal's source text with tidy_text and answer with the tidied text and what was fixed.",
    model=ReplayModel(Path(__file__).with_name("tidier.cassette.json")),
    goal_schema={"type": "object", "properties": {"source": {"type": "string", "maxLength": 100_000},
                                                  "problems": {"type": "array", "items": {"type": "string"}}},
                 "required": ["source"]},
    result_schema=Tidied,
    tools=[tidy_text],
    limits=Limits(max_steps=4),
)


def count_lines(state: TidyState) -> dict:
    """Count the text's lines."""
    return {"lines": state.source.count("\n")}


def count_words(state: TidyState) -> dict:
    """Count the text's words."""
    return {"words": len(state.source.split())}


def report(state: TidyState) -> dict:
    """Say what was done and what the text holds."""
    done = f"{len(state.fixes)} fix(es): {', '.join(state.fixes)}" if state.fixes else "nothing to fix"
    return {"report": f"{state.lines} lines, {state.words} words; {done}"}


graph = (
    Graph("tidy", state=TidyState, limits=Limits(max_steps=20))
    .node("lint", lint, reads=["source"], writes=["problems"])
    .node("fix", agent="tidier", reads=["source", "problems"], writes=["source", "fixes"], retries=1,
          output=lambda out: {"source": out["source"], "fixes": out["fixed"]})
    .node("count_lines", count_lines, reads=["source"], writes=["lines"])
    .node("count_words", count_words, reads=["source"], writes=["words"])
    .node("report", report, reads=["lines", "words", "fixes"], writes=["report"])
    .edge(START, "lint")
    .edge("lint", "fix", when=lambda s: bool(s.problems), label="problems")
    .edge("lint", "count_lines", when=lambda s: not s.problems, label="clean")
    .edge("lint", "count_words", when=lambda s: not s.problems, label="clean")
    .edge("fix", "lint")
    .join(["count_lines", "count_words"], "report")
    .edge("report", END)
)
tidy = register_graph(graph)
