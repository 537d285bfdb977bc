"""People's answers: ``approvals``, ``approve``, ``deny``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import app
from agentfleet.cli.common import CallArg, EmbeddedOpt, RunArg, _json_arg, _runtime, _settings, err, out

AsOpt = Annotated[str | None, typer.Option("--as", help="Who answers (default: your OS user name)")]


@app.command()
def approvals(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's requests")] = None,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Tool calls waiting for a person's answer, oldest first (arguments with secrets masked)."""
    from agentfleet.ops.approvals import pending_approvals

    pending = pending_approvals(_runtime(_settings(embedded)).store, run_id=run_id)
    if as_json:
        print(json.dumps([r.summary() for r in pending], default=str))
        return
    table = Table("run", "call", "agent", "tool", "arguments", "why", "asked", "expires",
                  title=f"{len(pending)} pending approval(s)")
    for r in pending:
        table.add_row(r.run_id, r.call_id, r.agent, r.tool, json.dumps(r.shown, default=str)[:80], r.reason[:60],
                      r.requested_at.isoformat(timespec="seconds"),
                      r.expires_at.isoformat(timespec="seconds") if r.expires_at else "never")
    (out if out.is_terminal else Console(width=220)).print(table)
    if pending:
        flag = " --embedded" if embedded else ""
        out.print(f"answer: agentfleet approve{flag} RUN CALL [--note ...]   or   agentfleet deny{flag} RUN CALL "
                  "--reason ...")


def _answer_approval(run_id: str, call_id: str, decision: str, note: str | None, by: str | None,
                     arguments: str | None, embedded: bool, as_json: bool) -> None:
    from agentfleet.errors import AgentfleetError
    from agentfleet.ops.actions import answer_approval, who

    rt = _runtime(_settings(embedded))
    actor = who(by)
    edited = _json_arg(arguments, "--arguments") if arguments is not None else None
    try:
        # Beside an embedded fleet there is no broker to reach: its observer's timer finds the answer.
        reply = answer_approval(rt, run_id=run_id, call_id=call_id, decision=decision, by=actor, via="cli",
                                note=note, arguments=edited, publish=not rt.settings.embedded)
    except AgentfleetError as exc:
        raise typer.BadParameter(exc.message) from None
    if as_json:
        print(reply.model_dump_json(exclude_none=True))
    elif reply.status == "accepted":
        out.print(f"[green]{reply.decision}[/] {run_id} {call_id} by {actor}")
    else:
        err.print(f"[red]refused[/] {reply.error_code}: {reply.message}")
    raise typer.Exit(0 if reply.status == "accepted" else 1)


@app.command()
def approve(
    run_id: RunArg, call_id: CallArg,
    note: Annotated[str | None, typer.Option("--note", help="Kept with the answer")] = None,
    arguments: Annotated[str | None, typer.Option("--arguments", help="Run with these arguments instead (JSON, "
                                                                     "checked against the tool's schema)")] = None,
    by: AsOpt = None, embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Approve a parked tool call: it runs once, and the run goes on (exit 1 if the answer is refused)."""
    _answer_approval(run_id, call_id, "approve", note, by, arguments, embedded, as_json)


@app.command()
def deny(
    run_id: RunArg, call_id: CallArg,
    reason: Annotated[str, typer.Option("--reason", help="Told to the model as the call's result")],
    by: AsOpt = None, embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Deny a parked tool call: the model gets APPROVAL_DENIED with the reason and carries on."""
    _answer_approval(run_id, call_id, "deny", reason, by, None, embedded, as_json)
