"""Starting work: ``run`` (embedded), ``submit`` (to a fleet), ``publish`` a domain event, ``replay`` a recording."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from agentfleet import constants as C
from agentfleet import logs
from agentfleet.agents.registry import fleet_agents
from agentfleet.config.settings import get_settings
from agentfleet.errors import ErrorCode, GoalRejected
from agentfleet.events.contracts import Result

if TYPE_CHECKING:
    from agentfleet.models.base import Model
from agentfleet.cli.app import app
from agentfleet.cli.common import (
    STILL_RUNNING,
    AgentArg,
    GoalIdOpt,
    InputOpt,
    MaxStepsOpt,
    ThreadOpt,
    _exit_for,
    _goal,
    _json_arg,
    _print_result,
    _still_running,
    err,
    out,
)


@app.command()
def run(
    agent: AgentArg,
    input_json: InputOpt = "{}",
    goal_id: GoalIdOpt = None,
    max_steps: MaxStepsOpt = None,
    thread: ThreadOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only the Result JSON")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result")] = 600.0,
    model: Annotated[str | None, typer.Option(
        "--model", help="Run on this model spec instead of the agent's (openai:gpt-4.1-mini, "
                        "anthropic:…, openai-compatible:http://127.0.0.1:8080/v1:NAME, replay:FILE)")] = None,
    record: Annotated[Path | None, typer.Option(
        "--record", help="Record every model exchange of the run to this cassette (agentfleet replay reads it)")
    ] = None,
) -> None:
    """Run a goal in embedded mode: the whole fleet in this process (memory broker, SQLite)."""
    from agentfleet.models.recording import RecordingModel
    from agentfleet.models.spec import model_from_spec

    body = _goal(agent, input_json, goal_id, max_steps, thread)
    recorder: RecordingModel | None = None

    def swap(declared: Model) -> Model:
        nonlocal recorder
        chosen = model_from_spec(model) if model else declared
        if record is None:
            return chosen
        recorder = RecordingModel(chosen, record, agent=agent, goal=body["input"])
        return recorder

    result = _run_embedded(agent, body, swap if model or record else None, as_json, timeout)
    if recorder is not None:
        recorder.finish(result.model_dump(mode="json", exclude_none=True))
        if not as_json:
            out.print(f"recorded {len(recorder.cassette.turns)} model turns to {record}")
    _exit_for(result)


def _run_embedded(agent: str, body: dict[str, Any], swap: Callable[[Model], Model] | None, as_json: bool,
                  timeout: float, *, show_result: bool = True) -> Result:
    """One goal through an embedded fleet, followed on screen; ``swap`` chooses the agent's model."""
    from agentfleet.ops.progress import follow
    from agentfleet.workers.embedded import EmbeddedFleet

    settings = get_settings().with_profile("embedded")
    logs.configure("WARNING" if settings.log_level != "DEBUG" else "DEBUG", settings.log_json)
    with EmbeddedFleet(settings) as fleet:
        spec = fleet.runtime.agent(agent)
        if spec is not None and swap is not None:
            fleet.use_model(agent, swap(spec.model))
            spec = fleet.runtime.agent(agent)
        try:
            run_id = fleet.submit(body)
        except GoalRejected as exc:
            result = Result.rejection(exc.code, exc.message, agent=agent, goal_id=body.get("goal_id"))
            _print_result(result, as_json)
            _exit_for(result)
        if not as_json:
            assert spec is not None
            note = " (offline: no network, no API key)" if getattr(spec.model, "offline", False) else ""
            out.print(f"[bold]agentfleet[/] embedded · agent [cyan]{agent}[/] · model {spec.model.name}{note}")
            out.print(f"run {run_id}")
        result = follow(fleet.store, run_id, None if as_json else out, timeout_s=timeout, embedded=True)
        if result is None:
            _still_running(run_id, timeout, as_json)
        assert result is not None
        _settle_trace(fleet.store, run_id, timeout, quiet=as_json)
        if show_result:
            _print_result(result, as_json)  # before the fleet's warm shutdown, which takes a few seconds
    return result


def _settle_trace(store: Any, run_id: str, timeout: float, *, quiet: bool) -> None:
    """Embedded, the fleet ends with this command: show the runs this goal started once they have ended."""
    from agentfleet.ops.trace import settle_trace

    lines = settle_trace(store, run_id, timeout)
    if not quiet:
        for line in lines:
            out.print(line, soft_wrap=True, markup=False, highlight=False)


@app.command()
def publish(
    name: Annotated[str, typer.Argument(help="The event's name: routing key domain.<name>")],
    payload: Annotated[str, typer.Option("--payload", help="The payload, a JSON object")] = "{}",
    message_id: Annotated[str | None, typer.Option(
        "--id", help="The event's message id: sent again with the same id, it is the same event "
                     "(default: derived from the payload)")] = None,
    embedded: Annotated[bool, typer.Option("--embedded", help="On an embedded fleet in this process, following "
                                                              "the runs the event starts to their end")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the runs with --embedded")] = 600.0,
) -> None:
    """Publish a domain event as an outside system does: plain JSON to the inbox, routing key domain.<name>.

    An event that breaks its schema is refused here (exit 1) before it is sent. Each agent whose trigger
    names it starts one run per event id."""
    from agentfleet.events.domain import external_event_id, problems

    data = _json_arg(payload, "--payload")
    fleet_agents(get_settings())  # the fleet's modules declare the events' schemas
    found = problems(name, data)
    if found:
        refusal = {"status": "rejected", "name": name, "error_code": ErrorCode.INPUT_INVALID.value,
                   "message": f"domain event {name!r} refused: {'; '.join(found)}"}
        print(json.dumps(refusal)) if as_json else err.print(f"[red]INPUT_INVALID[/]: {refusal['message']}")
        raise typer.Exit(1)
    body = json.dumps(data).encode()
    event_id = external_event_id(name, message_id, body)
    if embedded:
        _publish_embedded(name, data, event_id, as_json, timeout)
        return
    from agentfleet.ops.client import FleetClient

    with FleetClient(get_settings()) as client:
        client.publish_event(name, body, message_id=message_id)
    print(json.dumps({"name": name, "event_id": event_id})) if as_json else out.print(f"{name} {event_id}")


def _publish_embedded(name: str, payload: dict[str, Any], event_id: str, as_json: bool, timeout: float) -> None:
    """The event through an embedded fleet: the runs its triggers start, followed to their end and shown."""
    import time

    from agentfleet.events.domain import external_event, started_by
    from agentfleet.loop.keys import run_id_for
    from agentfleet.loop.states import is_terminal
    from agentfleet.workers.embedded import EmbeddedFleet

    settings = get_settings().with_profile("embedded")
    logs.configure("WARNING" if settings.log_level != "DEBUG" else "DEBUG", settings.log_json)
    with EmbeddedFleet(settings) as fleet:
        store = fleet.store
        new = not store.domain_events(event_id=event_id)
        starts = started_by(fleet.runtime.agents.triggered_by(name), event_id, payload)
        fleet.runtime.publisher.publish([external_event(name, event_id, payload)])
        if not as_json:
            out.print(f"{name} {event_id}" + ("" if new else " (already received: it starts nothing new)"))
            for start in starts:
                if start.problems:
                    out.print(f"  {start.agent}: not started, its trigger's input breaks its goal schema: "
                              f"{'; '.join(start.problems)}", markup=False)
            if not starts:
                out.print(f"  no agent's trigger names {name}")
        run_ids = [run_id_for(s.agent, s.goal_id) for s in starts if not s.problems]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(
                (run := store.get_run(r)) is not None and is_terminal(run.state) for r in run_ids):
            time.sleep(0.1)
        for run_id in run_ids[:1]:  # every triggered run shares the event's trace
            _settle_trace(store, run_id, max(0.0, deadline - time.monotonic()), quiet=as_json)
        runs = [run for r in run_ids if (run := store.get_run(r)) is not None]
        if not as_json and runs and len(store.runs_in_trace(runs[0].trace_id)) < 2:  # no tree was shown
            for r in runs:
                out.print(f"  {r.agent} {r.run_id} {r.state.value} {r.error_code or ''}", markup=False)
        if as_json:
            print(json.dumps({"name": name, "event_id": event_id, "new": new, "runs": [
                {"agent": r.agent, "run_id": r.run_id, **(r.result or {"status": r.state.value.lower()})}
                for r in runs]}, default=str))
    if len(runs) < len(run_ids):
        raise typer.Exit(STILL_RUNNING)


@app.command()
def replay(
    cassette: Annotated[Path, typer.Argument(help="A cassette recorded with agentfleet run --record")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result")] = 600.0,
) -> None:
    """Re-run a recorded goal on the current code, the model played back strictly from the recording, and
    report step by step where the requests (so the tools' results or the prompt) or the Result diverge.
    Exit 0 when nothing diverged, 1 otherwise."""
    from agentfleet.models.replay import ReplayModel

    player = ReplayModel(cassette, strict=True)
    recorded = player.cassette
    if recorded.agent is None or recorded.goal is None:
        err.print(f"{cassette} was not recorded from a run (no agent and goal in it); "
                  "record one with: agentfleet run AGENT --input ... --record FILE")
        raise typer.Exit(C.EXIT_CONFIGURATION)
    result = _run_embedded(recorded.agent, {"agent": recorded.agent, "input": recorded.goal}, lambda _: player,
                           as_json, timeout, show_result=not as_json)
    now = result.model_dump(mode="json", exclude_none=True)
    was = recorded.result or {}
    same_result = {k: now.get(k) for k in ("status", "output", "error_code")} == {
        k: was.get(k) for k in ("status", "output", "error_code")}
    report = {"cassette": str(cassette), "steps": [{"iteration": i, "matched": ok, "divergence": said or None}
                                                   for i, ok, said in player.checks],
              "result_matches": same_result, "recorded_result": was, "result": now}
    if as_json:
        print(json.dumps(report, default=str))
    else:
        for i, ok, said in player.checks:
            told = "[green]same request as recorded[/]" if ok else f"[red]diverged[/]: {escape(said)}"
            out.print(f"iteration {i}: {told}", soft_wrap=True)
        out.print("result: " + ("[green]same as recorded[/]" if same_result else
                                f"[red]differs[/]: recorded {was.get('status')} {json.dumps(was.get('output'))[:200]}"
                                f"; now {now.get('status')} {json.dumps(now.get('output'))[:200]}"), soft_wrap=True)
    diverged = not same_result or not all(ok for _, ok, _ in player.checks)
    raise typer.Exit(1 if diverged else 0)


@app.command()
def submit(
    agent: AgentArg,
    input_json: InputOpt = "{}",
    goal_id: GoalIdOpt = None,
    max_steps: MaxStepsOpt = None,
    thread: ThreadOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run to its end")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait")] = 600.0,
) -> None:
    """Publish a goal to the distributed fleet's inbox (the public AMQP contract).

    A goal for an agent this machine also loads is admitted here first, so a bad goal is refused
    (exit 1) before it is sent; the fleet admits it again either way."""
    from agentfleet.ops.client import FleetClient
    from agentfleet.roles.admission import admit

    settings = get_settings()
    body = _goal(agent, input_json, goal_id or str(uuid.uuid4()), max_steps, thread)
    with FleetClient(settings) as client:
        if agent in client.rt.agents:
            try:
                admit(client.rt.agents, body)
            except GoalRejected as exc:
                rejection = Result.rejection(exc.code, exc.message, agent=agent, goal_id=body["goal_id"])
                _print_result(rejection, as_json)
                _exit_for(rejection)
        run_id = client.run_id(body)
        if not wait:
            client.publish_goal(body)
            print(json.dumps({"run_id": run_id, "goal_id": body["goal_id"]}) if as_json else run_id)
            return
        show = None
        if not as_json:  # the run's steps as its workers announce them on <ns>.public (the goal asks for them)
            from agentfleet.ops.progress import notice_line

            out.print(f"run {run_id}")

            def show(notice: dict[str, Any]) -> None:
                line = notice_line(notice, run_id)
                if line is not None:
                    out.print(line, markup=False, highlight=False, soft_wrap=True)

        result = client.submit_and_wait(body, timeout_s=timeout, on_notice=show)
    if result is None:
        _still_running(run_id, timeout, as_json)
    assert result is not None
    _print_result(result, as_json)
    _exit_for(result)
