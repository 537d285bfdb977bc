"""``agentfleet threads`` and ``agentfleet thread ID``: conversations that continue across goals."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentfleet.cli.app import app
from agentfleet.cli.common import EmbeddedOpt, _runtime, _settings, err, out


@app.command("threads")
def threads_list(
    limit: Annotated[int, typer.Option("--limit", help="At most this many")] = 50,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Threads (goals given --thread / "thread_id"), most recently active first, with how many runs each has."""
    from agentfleet.ops.threads import threads

    found = threads(_runtime(_settings(embedded)).store, limit)
    if as_json:
        print(json.dumps(found, default=str))
        return
    table = Table("thread", "runs", "started", "last active", title=f"{len(found)} thread(s)")
    for t in found:
        table.add_row(t["thread_id"], str(t["runs"]), t["created_at"].isoformat(timespec="seconds"),
                      t["updated_at"].isoformat(timespec="seconds"))
    (out if out.is_terminal else Console(width=200)).print(table)


@app.command("thread")
def thread_show(
    thread_id: Annotated[str, typer.Argument(help="Thread id")],
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """A thread's runs in order: each one's state, what it was asked and what it answered."""
    from agentfleet.ops.threads import thread

    runs = thread(_runtime(_settings(embedded)).store, thread_id)
    if not runs:
        err.print(f"no thread {thread_id}")
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(runs, default=str))
        return
    for r in runs:
        out.print(f"{r['run_id']} {r['state']} {r['agent']} {r['created_at']}", markup=False, highlight=False)
        out.print(f"  asked:    {r['goal'][:300]}", markup=False, highlight=False, soft_wrap=True)
        if r["answer"]:
            out.print(f"  answered: {r['answer'][:300]}", markup=False, highlight=False, soft_wrap=True)
