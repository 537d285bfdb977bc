"""``agentfleet retry`` and ``agentfleet fork``: a new run from another run's checkpoint (ops/lineage.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentfleet.cli.app import app
from agentfleet.cli.common import (
    STILL_RUNNING,
    EmbeddedOpt,
    _exit_for,
    _json_arg,
    _print_result,
    _runtime,
    _settings,
    err,
    out,
)

if TYPE_CHECKING:
    from agentfleet.events.envelope import Envelope

WaitOpt = Annotated[bool, typer.Option("--wait", help="Follow the new run to its end")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON")]
TimeoutOpt = Annotated[float, typer.Option(help="Seconds to wait with --wait or --embedded")]


@app.command()
def retry(
    run_id: Annotated[str, typer.Argument(help="A failed or cancelled run")],
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Raise its max_steps (one it ran out of)")]
    = None,
    embedded: EmbeddedOpt = False, wait: WaitOpt = False, as_json: JsonOpt = False, timeout: TimeoutOpt = 600.0,
) -> None:
    """Go on from a failed or cancelled run's last good checkpoint, as a new run: its turns and recorded tool
    results are not repeated; a call whose outcome is unknown is told to the model as such, never re-run."""
    from agentfleet.ops.lineage import retry_goal

    rt = _runtime(_settings(embedded))
    _start(rt, retry_goal(rt.store, rt.agents, run_id, max_steps=max_steps), embedded, wait, as_json, timeout)


@app.command()
def fork(
    run_id: Annotated[str, typer.Argument(help="Any root run")],
    from_iteration: Annotated[int, typer.Option("--from", help="Plan this iteration again (0: from the start)")],
    edit_input: Annotated[str | None, typer.Option("--edit-input", help="JSON object of goal input fields to "
                                                                        "change (checked against the goal schema)")]
    = None,
    embedded: EmbeddedOpt = False, wait: WaitOpt = False, as_json: JsonOpt = False, timeout: TimeoutOpt = 600.0,
) -> None:
    """A new run with a run's transcript before an iteration, which plans that iteration again (optionally with its
    goal's input edited). The old run stays as it is."""
    from agentfleet.ops.lineage import fork_goal

    rt = _runtime(_settings(embedded))
    edit = _json_arg(edit_input, "--edit-input") if edit_input is not None else None
    _start(rt, fork_goal(rt.store, rt.agents, run_id, from_iteration, edit_input=edit), embedded, wait, as_json,
           timeout)


def _start(rt: Any, event: Envelope, embedded: bool, wait: bool, as_json: bool, timeout: float) -> None:
    lineage = event.payload["lineage"]
    said = {"run_id": event.run_id, "goal_id": event.payload["goal_id"],
            f"{'retry_of' if lineage['kind'] == 'retry' else 'forked_from'}": lineage["run_id"],
            "from_iteration": lineage["through"] + 1}
    if embedded:
        _run_embedded(event, as_json, timeout)
        return
    rt.publisher.publish([event])
    if not wait:
        print(json.dumps(said) if as_json else event.run_id)
        return
    from agentfleet.ops.client import FleetClient

    if not as_json:
        out.print(f"run {event.run_id} ({lineage['kind']} of {lineage['run_id']} from iteration "
                  f"{lineage['through'] + 1})", markup=False, highlight=False)
    with FleetClient(rt.settings) as client:
        result = client.wait(event.run_id, timeout_s=timeout)
    if result is None:
        err.print(f"still running after {timeout:g}s (the run goes on): agentfleet status {event.run_id}")
        raise typer.Exit(STILL_RUNNING)
    _print_result(result, as_json)
    _exit_for(result)


def _run_embedded(event: Envelope, as_json: bool, timeout: float) -> None:
    from agentfleet.config.settings import get_settings
    from agentfleet.ops.progress import follow
    from agentfleet.workers.embedded import EmbeddedFleet

    with EmbeddedFleet(get_settings().with_profile("embedded")) as fleet:
        fleet.runtime.publisher.publish([event])
        if not as_json:
            out.print(f"run {event.run_id}", markup=False, highlight=False)
        result = follow(fleet.store, event.run_id, None if as_json else out, timeout_s=timeout, embedded=True)
        if result is None:
            err.print(f"still running after {timeout:g}s: agentfleet status {event.run_id} --embedded")
            raise typer.Exit(STILL_RUNNING)
        _print_result(result, as_json)
    _exit_for(result)
