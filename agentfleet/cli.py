"""The ``agentfleet`` command."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentfleet import constants as C
from agentfleet import logs
from agentfleet.agents.registry import fleet_agents
from agentfleet.config.settings import Settings, get_settings
from agentfleet.errors import AgentfleetError, ConfigurationError, ErrorCode, GoalRejected, ServiceUnreachable
from agentfleet.events.contracts import Goal, Result, ResultStatus

if TYPE_CHECKING:
    from agentfleet.models.base import Model

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run LLM agents as a fleet of message-driven workers.")
ns_app = typer.Typer(no_args_is_help=True, help="Namespaces on the broker.")
app.add_typer(ns_app, name="namespace")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters: list, show, replay, purge.")
app.add_typer(dlq_app, name="dlq")
out = Console()
err = Console(stderr=True)


AgentArg = Annotated[str, typer.Argument(help="Agent name")]
InputOpt = Annotated[str, typer.Option("--input", "-i", help="Goal input as JSON")]
GoalIdOpt = Annotated[str | None, typer.Option(help="Idempotency key (default: new)")]
MaxStepsOpt = Annotated[int | None, typer.Option(help="Tighter max_steps for this goal")]
RunArg = Annotated[str, typer.Argument(help="Run id")]
CallArg = Annotated[str, typer.Argument(help="Call id (from `agentfleet approvals`)")]


def _json_arg(raw: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise typer.BadParameter(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{what} must be a JSON object")
    return value


def _goal(agent: str, input_json: str, goal_id: str | None, max_steps: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": _json_arg(input_json, "--input")}
    if goal_id:
        body["goal_id"] = goal_id
    if max_steps:
        body["limits"] = {"max_steps": max_steps}
    return body


def _cost(cost_usd: float, unpriced: bool) -> str:
    """Dollars, saying when some model had no price (the cost shown is then a floor, not the total)."""
    if unpriced:
        return f"${cost_usd:.4f} + unpriced" if cost_usd else "unpriced"
    return f"${cost_usd:.4f}"


def _print_result(result: Result, as_json: bool) -> None:
    if as_json:
        print(result.model_dump_json(exclude_none=True))
        return
    colour = "green" if result.status == ResultStatus.SUCCEEDED else "red"
    out.print(f"[bold {colour}]{result.status.value}[/] run={result.run_id} "
              f"steps={result.usage.steps} tokens={result.usage.tokens} "
              f"cost={_cost(result.usage.cost_usd, result.usage.unpriced)}")
    if result.error_code:
        out.print(f"[red]{result.error_code}[/]: {result.message}")
        if result.recovery_suggestion:
            out.print(f"hint: {result.recovery_suggestion}")
    out.print_json(result.model_dump_json(exclude_none=True))


def _exit_for(result: Result) -> None:
    raise typer.Exit(0 if result.status == ResultStatus.SUCCEEDED else 1)


STILL_RUNNING = 3  # exit code: the wait ran out, the run did not (distinct from a failed run's 1)


def _still_running(run_id: str, timeout: float, as_json: bool) -> None:
    """The caller's wait ended, not the run: say so, and never dress it up as the run's Result."""
    if as_json:
        print(json.dumps({"status": "running", "run_id": run_id, "waited_s": timeout}))
    else:
        err.print(f"still running after {timeout:g}s (the run goes on): agentfleet status {run_id}")
    raise typer.Exit(STILL_RUNNING)


@app.command()
def run(
    agent: AgentArg,
    input_json: InputOpt = "{}",
    goal_id: GoalIdOpt = None,
    max_steps: MaxStepsOpt = None,
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

    body = _goal(agent, input_json, goal_id, max_steps)
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
    """Embedded, the fleet ends with this command: let the runs this goal started (delegated, triggered by
    its events) finish first, and show them. Settled when every run of the trace has ended twice running."""
    import time

    from agentfleet.loop.states import is_terminal
    from agentfleet.ops.trace import trace_lines, trace_of

    run = store.get_run(run_id)
    if run is None or (len(store.runs_in_trace(run.trace_id)) < 2 and not store.domain_events(run_id=run_id)):
        return  # it started nothing: nothing to wait for
    deadline, settled, last = time.monotonic() + timeout, 0, None
    while settled < 2 and time.monotonic() < deadline:
        runs = store.runs_in_trace(run.trace_id)
        now_seen = [(r.run_id, r.state) for r in runs]
        settled = settled + 1 if now_seen == last and all(is_terminal(r.state) for r in runs) else 0
        last = now_seen
        time.sleep(0.25)
    found = trace_of(store, run_id)
    if quiet or found is None or len(store.runs_in_trace(run.trace_id)) < 2:
        return
    lines = trace_lines(found)
    start = next((i for i, line in enumerate(lines) if line.startswith("runs of trace")), None)
    for line in lines[start:] if start is not None else []:
        if line.startswith("end:"):
            break
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
    from agentfleet.agents.registry import fleet_agents
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
    body = _goal(agent, input_json, goal_id or str(uuid.uuid4()), max_steps)
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
        progress = None
        if not as_json:
            from agentfleet.ops.progress import Progress

            out.print(f"run {run_id}")
            progress = Progress(client.rt.store, run_id, out)
        result = client.submit_and_wait(body, timeout_s=timeout, on_tick=progress.show if progress else None)
        if progress is not None and result is not None:
            progress.show()  # the steps that finished since the last look
    if result is None:
        _still_running(run_id, timeout, as_json)
    assert result is not None
    _print_result(result, as_json)
    _exit_for(result)


def _runtime(settings: Settings) -> Any:
    """The fleet's runtime, once its database answers (tried for AGENTFLEET_CONNECT_TIMEOUT_S, else exit 69)."""
    from agentfleet.roles.runtime import runtime_for
    from agentfleet.workers.app import create_app
    from agentfleet.workers.preflight import reach_all

    reach_all(settings, "database")
    return runtime_for(create_app(settings))


EmbeddedOpt = Annotated[bool, typer.Option("--embedded", help="A run of `agentfleet run` (the embedded fleet's "
                                                           "SQLite database in this directory)")]


def _settings(embedded: bool) -> Settings:
    settings = get_settings()
    return settings.with_profile("embedded") if embedded else settings


@app.command()
def status(
    run_id: Annotated[str, typer.Argument(help="Run id")],
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Show a run's state, usage, steps and approvals from its checkpoint, and whether it looks stuck."""
    from agentfleet.events.publisher import queue_depths
    from agentfleet.ops.progress import describe_run
    from agentfleet.roles.sweeper import Action, assess
    from agentfleet.store.records import now

    rt = _runtime(_settings(embedded))
    described = describe_run(rt.store, run_id)
    if described is None:
        err.print(f"no run {run_id}")
        raise typer.Exit(2)
    run = rt.store.get_run(run_id)
    # an embedded fleet's queues live in its process
    ready = {} if rt.settings.embedded else queue_depths(rt.publisher.app, rt.topology)
    assessed = assess(rt, run, now(), ready) if run is not None else None
    stuck = None
    if assessed is not None and assessed[1].action != Action.WAIT:
        stuck = {"quiet_s": round(assessed[0], 1), "action": assessed[1].action.value, "reason": assessed[1].reason}
    described["stuck"] = stuck
    if as_json:
        print(json.dumps(described, default=str))
        return
    out.print(f"run {run_id}: [bold]{described['state']}[/] agent={described['agent']} "
              f"iteration={described['iteration']} steps={described['usage']['steps']} "
              f"tokens={described['usage']['tokens']} (cached {described['usage']['cached_input_tokens']}) "
              f"cost={_cost(described['usage']['cost_usd'], described['usage']['unpriced'])}")
    if stuck:
        out.print(f"[bold yellow]looks stuck[/]: nothing for {stuck['quiet_s']:.0f}s ({stuck['reason']}); "
                  f"the sweeper will {stuck['action']} it (now: agentfleet sweep)")
    table = Table("iteration", "kind", "name", "status", "attempts", "ms", "tokens", "cost", "worker")
    for s in described["steps"]:
        spent = (s["output"] or {}).get("usage") if s["kind"] == "plan" and isinstance(s["output"], dict) else None
        tokens = str(spent.get("input_tokens", 0) + spent.get("output_tokens", 0)) if spent else "-"
        cost = _cost(spent.get("cost_usd", 0.0), spent.get("unpriced", False)) if spent else "-"
        table.add_row(str(s["iteration"]), s["kind"], s["name"] or "-", s["status"], str(s["attempts"]),
                      f"{s['duration_ms'] or 0:.1f}", tokens, cost, s["worker"] or "-")
    out.print(table)
    if described["approvals"]:
        asked = Table("iteration", "call", "tool", "arguments", "rule", "answer", "by", "at", "note")
        for a in described["approvals"]:
            at = a["resolved_at"].isoformat(timespec="seconds") if a["resolved_at"] else "-"
            asked.add_row(str(a["iteration"]), a["call_id"], a["tool"], json.dumps(a["shown"], default=str)[:60],
                          a["rule"][:40], a["status"] + (" (edited)" if a["edited_arguments"] is not None else ""),
                          a["resolved_by"] or "-", at, (a["note"] or "-")[:60])
        out.print(asked)
    if described["parent_run_id"]:
        out.print(f"started by run {described['parent_run_id']} (a delegation)")
    if described["children"]:
        from rich.tree import Tree

        root = Tree(f"{described['agent']} {run_id} [bold]{described['state']}[/]")

        def grow(node: Tree, children: list[dict[str, Any]]) -> None:
            for c in children:
                u = c["usage"]
                branch = node.add(f"{c['agent']} {c['run_id']} [bold]{c['state']}[/]"
                                  + (f" {c['error_code']}" if c["error_code"] else "")
                                  + f" steps={u['steps']} tokens={u['tokens']} ← {c['started_by']}")
                grow(branch, c["children"])

        grow(root, described["children"])
        out.print(root)
    if described["result"]:
        out.print_json(json.dumps(described["result"]))


@app.command()
def artifacts(
    run_id: Annotated[str, typer.Argument(help="Run id")],
    ref: Annotated[str | None, typer.Option("--ref", help="Write this artifact's content to stdout")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="With --ref: write the content here")] = None,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """A run's artifacts: outputs too large for the model's context, and work directories tools kept."""
    rt = _runtime(_settings(embedded))
    if ref is not None:
        with output.open("wb") if output is not None else contextlib.nullcontext(sys.stdout.buffer) as sink:
            found = rt.store.copy_artifact(run_id, ref, sink)  # a chunk at a time: a kept tree may be large
        if not found:
            if output is not None:
                output.unlink(missing_ok=True)
            err.print(f"run {run_id} has no artifact {ref}")
            raise typer.Exit(2)
        return
    kept = rt.store.artifacts_of(run_id)
    if as_json:
        print(json.dumps(kept, default=str))
        return
    table = Table("ref", "kind", "bytes", "media type", "tool", "call", "at", title=f"{len(kept)} artifact(s)")
    for a in kept:
        table.add_row(a["ref"], a["kind"], str(a["size"]), a["media_type"], a["tool"], a["call_id"],
                      a["created_at"].isoformat(timespec="seconds"))
    (out if out.is_terminal else Console(width=240)).print(table)


@app.command()
def runs(
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's runs")] = None,
    state: Annotated[list[str] | None, typer.Option("--state", "-s", help="Only runs in this state (repeatable)")
                     ] = None,
    since: Annotated[str | None, typer.Option("--since", help="Created at most this long ago (30m, 2h, 1d) or "
                                                              "since an ISO 8601 time")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first")] = 50,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines")] = False,
) -> None:
    """List runs, newest first: state, iterations, tokens, cost and how each ended."""
    from agentfleet.loop.states import RunState
    from agentfleet.ops.deadletters import parse_since

    states = [s.upper() for s in state or []]
    unknown = [s for s in states if s not in RunState.__members__]
    if unknown:
        raise typer.BadParameter(f"unknown state {', '.join(unknown)}; one of {', '.join(RunState.__members__)}",
                                 param_hint="--state")
    rt = _runtime(_settings(embedded))
    found = rt.store.list_runs(agent=agent, states=states, since=parse_since(since) if since else None, limit=limit)
    for run in found:
        row = {"run_id": run.run_id, "agent": run.agent, "state": run.state.value, "iteration": run.iteration,
               "tokens": run.input_tokens + run.output_tokens, "cost_usd": run.cost_usd, "unpriced": run.unpriced,
               "created_at": run.created_at.isoformat(timespec="seconds"), "error_code": run.error_code}
        if as_json:
            print(json.dumps(row))
        else:
            ended = f" {run.error_code}" if run.error_code else ""
            out.print(f"{row['run_id']}  {row['created_at']}  {run.agent}  {row['state']}{ended}  "
                      f"iterations={run.iteration + 1} tokens={row['tokens']} cost={_cost(run.cost_usd, run.unpriced)}",
                      soft_wrap=True, markup=False, highlight=False)


@app.command()
def trace(
    run_id: RunArg,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """What happened to a run and why: model turns, tool calls, transitions and the end reason, in order."""
    from agentfleet.ops.trace import trace_lines, trace_of

    rt = _runtime(_settings(embedded))
    found = trace_of(rt.store, run_id, rt.agents)
    if found is None:
        err.print(f"no run {run_id}")
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(found, default=str))
        return
    for line in trace_lines(found):
        out.print(line, soft_wrap=True, markup=False, highlight=False)


@app.command()
def sweep(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be re-driven; change nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Re-drive stalled runs from their last checkpoint once (observer workers also do it on a timer)."""
    from agentfleet.roles.sweeper import sweep as sweep_once

    findings = sweep_once(_runtime(get_settings()), dry_run=dry_run)
    if findings is None:
        err.print("another sweeper is sweeping right now; nothing done")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps([{**f.__dict__, "action": f.action.value} for f in findings]))
        return
    verb = "would" if dry_run else "did"
    table = Table("run", "agent", "state", "iteration", "quiet s", f"{verb}", "why", "events",
                  title=f"{len(findings)} stalled run(s)")
    for f in findings:
        table.add_row(f.run_id, f.agent, f.state, str(f.iteration), f"{f.quiet_s:.0f}", f.action.value, f.reason,
                      str(f.events))
    (out if out.is_terminal else Console(width=200)).print(table)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="Run id")],
    reason: Annotated[str, typer.Option(help="Why")] = "cancelled by request",
) -> None:
    """Ask the fleet to cancel a run: running subprocess tools are killed, Python tools told (ctx.cancelled)."""
    from agentfleet.ops.client import FleetClient

    with FleetClient(get_settings()) as client:
        client.cancel(run_id, reason)
    out.print(f"cancel requested for {run_id}")


AsOpt = Annotated[str | None, typer.Option("--as", help="Who answers (default: your OS user name)")]


@app.command()
def approvals(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's requests")] = None,
    embedded: EmbeddedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Tool calls waiting for a person's answer, oldest first (arguments with secrets masked)."""
    rt = _runtime(_settings(embedded))
    pending = rt.store.pending_approvals(run_id=run_id)
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
    import getpass

    from pydantic import ValidationError

    from agentfleet.errors import ApprovalRefused
    from agentfleet.events.contracts import ApprovalAnswer, ApprovalResolve
    from agentfleet.roles.approvals import resolve

    rt = _runtime(_settings(embedded))
    who = by or getpass.getuser()
    edited = _json_arg(arguments, "--arguments") if arguments is not None else None
    try:
        answer = ApprovalResolve(run_id=run_id, call_id=call_id, decision=decision,  # type: ignore[arg-type]
                                 note=note, arguments=edited, by=who)
    except ValidationError as exc:
        problem = exc.errors()[0]
        raise typer.BadParameter(f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}") from None
    try:
        # Beside an embedded fleet there is no broker to reach: its observer's timer finds the answer.
        reply = resolve(rt, answer, who, publish=not rt.settings.embedded)
    except ApprovalRefused as exc:
        reply = ApprovalAnswer.rejection(exc.code, exc.message, run_id=run_id, call_id=call_id)
    if as_json:
        print(reply.model_dump_json(exclude_none=True))
    elif reply.status == "accepted":
        out.print(f"[green]{reply.decision}[/] {run_id} {call_id} by {who}")
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


@app.command()
def worker(
    role: Annotated[str, typer.Argument(help="planner | executor | observer")],
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Pool size")] = None,
    pool: Annotated[str | None, typer.Option(help="threads (resizable, the default) | prefork | solo")] = None,
    autoscale: Annotated[str | None, typer.Option(
        help="MAX,MIN: grow and shrink the pool with the load (instead of --concurrency)")] = None,
    loglevel: Annotated[str | None, typer.Option(help="Log level")] = None,
    hostname: Annotated[str | None, typer.Option(help="Celery node name (default role.pid@host)")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        help="Serve Prometheus metrics on this port (0: any free port; default AGENTFLEET_METRICS_PORT)")] = None,
) -> None:
    """Start one role's Celery worker against the distributed fleet."""
    from agentfleet.workers.roles import ROLES, pool_implementation, worker_argv

    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}")
    settings = get_settings()
    if metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": metrics_port})
    chosen_pool = pool or ROLES[role].default_pool
    if settings.metrics_port is not None and chosen_pool == "prefork":
        from agentfleet.hooks.metrics_dir import use_multiprocess_metrics

        use_multiprocess_metrics(role)  # before anything imports prometheus-client (workers.app does)

    from agentfleet.redaction import install_for
    from agentfleet.roles.runtime import PREFLIGHT_DONE_KEY
    from agentfleet.workers.app import create_app
    from agentfleet.workers.preflight import preflight

    install_for(settings)  # the preflight's messages are masked too
    preflight(settings)  # ConfigurationError: main() prints it and exits 2, before anything is consumed
    if role == C.EXECUTOR:  # what this host offers to bound each sandboxed call: found (and logged) before work
        from agentfleet.sandbox.call_bounds import host_bounds

        host_bounds()
    celery_app = create_app(settings)
    celery_app.conf[PREFLIGHT_DONE_KEY] = True
    celery_app.conf.worker_pool = pool_implementation(chosen_pool)
    argv = worker_argv(ROLES[role], settings.namespace, concurrency=concurrency, autoscale=autoscale,
                       loglevel=loglevel or settings.log_level,
                       hostname=hostname or f"{role}.{os.getpid()}@%h")
    celery_app.worker_main(argv)


def _control_plane() -> tuple[Any, Any]:
    """The namespace's Celery app and topology, once the broker answers."""
    from agentfleet.events.topology import Topology
    from agentfleet.workers.app import create_app
    from agentfleet.workers.preflight import reach_all

    settings = get_settings()
    reach_all(settings, "broker")
    return create_app(settings), Topology(settings.namespace)


@app.command()
def workers(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for workers to answer")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """The namespace's live workers by role: pool and size, tasks running now, and each role queue's depth."""
    import dataclasses

    from agentfleet.events.publisher import queue_depths
    from agentfleet.ops.control import live_workers

    celery_app, topology = _control_plane()
    found = live_workers(celery_app, topology, timeout)
    depths = queue_depths(celery_app, topology)
    if as_json:
        print(json.dumps({"workers": [dataclasses.asdict(w) for w in found], "queue_depths": depths}))
        return
    for role in C.ROLES:
        mine = [w for w in found if role in w.roles]
        out.print(f"{role}: {len(mine)} worker(s), {sum(w.size for w in mine)} threads, queue depth "
                  f"{depths.get(role, '?')}", soft_wrap=True, highlight=False)
        for w in mine:
            scaling = f" autoscale {w.autoscale['min']}..{w.autoscale['max']}" if w.autoscale else ""
            out.print(f"  {w.name}  pool={w.pool} size={w.size}{scaling} active={w.active}", soft_wrap=True,
                      markup=False, highlight=False)


@app.command()
def scale(
    role: Annotated[str, typer.Argument(help="planner | executor | observer")],
    total: Annotated[int, typer.Argument(help="Threads in all, over the role's live workers")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each answer")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Set a role's total pool size across its live workers, live (spread evenly); prints what each confirmed."""
    import dataclasses

    from agentfleet.ops.control import scale as resize

    if role not in C.ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(C.ROLES)}")
    if total < 1:
        raise typer.BadParameter("at least 1")
    celery_app, topology = _control_plane()
    done = resize(celery_app, topology, role, total, timeout)
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in done]))
    else:
        for r in done:
            out.print(f"{r.name}: {r.before} → {r.after if r.after is not None else '?'} ({r.answer})",
                      soft_wrap=True, markup=False, highlight=False)
    if any(r.after is None for r in done):
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="HTTP port")] = 5555,
    address: Annotated[str, typer.Option(help="Bind address")] = "127.0.0.1",
    unauthenticated_api: Annotated[
        bool, typer.Option("--unauthenticated-api", help="Serve Flower's HTTP API without auth (local use only)")
    ] = False,
) -> None:
    """Start Flower against the configured broker (extra options pass through to Flower)."""
    from agentfleet.workers.app import create_app

    if unauthenticated_api:
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    celery_app = create_app(get_settings())
    celery_app.start(["flower", f"--port={port}", f"--address={address}", *ctx.args])


@app.command()
def agents(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """List the agents this configuration loads, with their goal schemas."""
    registry = fleet_agents(get_settings())
    specs = {n: {"tools": list(a.tools), "goal_schema": a.goal_schema, "result_schema": a.result_schema,
                 "model": a.model.name, "limits": a.limits.model_dump()}
             for n in registry.names() if (a := registry.get(n))}
    if as_json:
        print(json.dumps(specs))
        return
    for name, spec in specs.items():
        out.print(f"[cyan]{name}[/] model={spec['model']} tools={', '.join(spec['tools'])}")


@app.command()
def plugins(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """Every plugin found (installed entry points, AGENTFLEET_PLUGIN_PATHS folders): source, version, state.

    Exits 2 with the reason when they cannot all be loaded (the fleet's workers would not start)."""
    from agentfleet.agents.plugins import discover, plan

    settings = get_settings()
    try:
        states = plan(discover(settings.plugin_folders, entry_points=settings.plugin_entry_points),
                      settings.disabled_plugins)
    except ConfigurationError as exc:
        err.print(f"[bold red]plugins cannot load[/]: {exc}")
        raise typer.Exit(2) from None
    rows = [{"name": p.spec.name, "version": p.spec.version, "state": p.state, "order": i + 1,
             "source": p.spec.source, "requires": p.spec.requires, "modules": list(p.spec.modules)}
            for i, p in enumerate(states)]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("#", "plugin", "version", "state", "requires", "source", title=f"{len(rows)} plugin(s), in load "
                                                                                 "order")
    for r in rows:
        needs = ", ".join(f"{n} {v}".strip() for n, v in r["requires"].items()) or "-"
        colour = "green" if r["state"] == "enabled" else "dim"
        table.add_row(str(r["order"]) if r["state"] == "enabled" else "-", r["name"], r["version"],
                      f"[{colour}]{r['state']}[/]", needs, r["source"])
    (out if out.is_terminal else Console(width=240)).print(table)


@app.command()
def tools(
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's tools")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Every tool with its agent, tier, timeout, fallback and lock, and the fleet's view of its health."""
    rt = _runtime(get_settings())
    agents = [a for a in rt.agents.all() if agent is None or a.name == agent]
    if agent is not None and not agents:
        err.print(f"no agent {agent!r} (loaded: {', '.join(rt.agents.names())})")
        raise typer.Exit(2)
    rows = [{"agent": a.name, **row} for a in agents for row in rt.dispatch.status(list(a.tools.values()))]
    reachable = rt.redis.fail_open(lambda r: bool(r.ping()), False)
    if as_json:
        print(json.dumps({"redis": "reachable" if reachable else "unreachable", "tools": rows}, default=str))
        return
    if rt.settings.embedded:
        out.print("[yellow]embedded profile:[/] health, breakers and the cache live inside the running process; "
                  "this shows declarations only")
    elif not reachable:
        out.print(f"[bold red]Redis unreachable[/] at {rt.settings.redis_url}: gates fail open (every tool counts "
                  "as healthy), breakers and the cache are skipped, tools that declare a lock refuse to run")
    table = Table("agent", "tool", "kind", "tier", "timeout", "idem/ro", "fallback", "lock", "health", "age", "detail",
                  "breaker", "cache hits")
    for r in rows:
        colour = {"healthy": "green", "down": "red"}.get(r["health"], "dim")
        table.add_row(r["agent"], r["tool"], r["kind"], r["tier"] or "-", f"{r['timeout_s']:g}s",
                      f"{'I' if r['idempotent'] else '-'}{'R' if r['read_only'] else '-'}", r["fallback"] or "-",
                      r["lock"] or "-", f"[{colour}]{r['health']}[/]",
                      "-" if r["age_s"] is None else f"{r['age_s']:.0f}s", (r["detail"] or "-")[:60],
                      r["breaker"], str(r["cache_hits"]))
    out.print(table)


@app.command()
def health(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """Exit 0 when the fleet's Redis and every declared health check are healthy, 1 otherwise.

    For a container healthcheck. A check with no fresh answer in Redis is run here. Also says how this host
    bounds each sandboxed call (its own uid, cgroup, tmpfs sizes), or that it cannot.
    """
    from agentfleet.fleet.health_cache import plan_checks
    from agentfleet.harness.checks import run_check
    from agentfleet.sandbox.call_bounds import host_bounds

    rt = _runtime(get_settings())
    reachable = rt.redis.fail_open(lambda r: bool(r.ping()), False)
    plans = plan_checks(t for a in rt.agents.all() for t in a.tools.values())
    checks: dict[str, dict[str, Any]] = {}
    for name, plan in plans.items():
        entries = rt.dispatch.health.entries(plan.tools) if reachable else {}
        known = [e for e in entries.values() if e is not None]
        if known:
            worst = min(known, key=lambda e: e.status == "healthy")
            checks[name] = {"status": worst.status, "detail": worst.detail, "checked_by": worst.checked_by}
        else:
            outcome = run_check(plan.check, rt.dispatch.health.timeout_s(plan.check))
            checks[name] = {"status": "healthy" if outcome.healthy else "down", "detail": outcome.detail,
                            "checked_by": "here"}
    healthy = reachable and all(c["status"] == "healthy" for c in checks.values())
    bounds = host_bounds().describe()
    if as_json:
        print(json.dumps({"healthy": healthy, "redis": "reachable" if reachable else "unreachable",
                          "checks": checks, "per_call_bounds": bounds}))
    else:
        out.print(f"redis {'[green]reachable[/]' if reachable else '[red]unreachable[/]'} "
                  f"({rt.settings.redis_url if not rt.settings.embedded else 'in-process'})")
        for name, c in checks.items():
            colour = "green" if c["status"] == "healthy" else "red"
            out.print(f"check {name}: [{colour}]{c['status']}[/] {c['detail'] or ''} (by {c['checked_by']})")
        for bound, how in bounds.items():
            out.print(f"per call, {bound}: {how}", markup=False, highlight=False)
    raise typer.Exit(0 if healthy else 1)


@app.command()
def schema() -> None:
    """Print the public wire contracts (goal, approval answer, Result, public notices) as JSON Schema, for
    non-Python clients."""
    from agentfleet.events.contracts import (
        ApprovalAnswer,
        ApprovalNotice,
        ApprovalResolve,
        DomainNotice,
        RunNotice,
        ToolHealthNotice,
    )

    print(json.dumps({"goal": Goal.model_json_schema(), "result": Result.model_json_schema(),
                      "run.completed|run.failed": RunNotice.model_json_schema(),
                      "domain.<name>": DomainNotice.model_json_schema(),
                      "approval.resolve": ApprovalResolve.model_json_schema(),
                      "approval.answer": ApprovalAnswer.model_json_schema(),
                      "approval.requested|approval.resolved": ApprovalNotice.model_json_schema(),
                      "tool.health_changed": ToolHealthNotice.model_json_schema()}, indent=2))


@app.command()
def bench(
    suite: Annotated[str | None, typer.Argument(help="overhead | throughput | recovery | growth | in_flight | "
                                                     "delegation | "
                                                     "approvals | profile (default: all)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes, for development")] = False,
    output: Annotated[str, typer.Option(help="Where to write the figures as JSON")] = "benchmarks/results/latest.json",
) -> None:
    """Run the benchmarks (from a checkout: needs RabbitMQ, Postgres and Redis on localhost)."""
    from pathlib import Path

    sys.path.insert(0, str(Path.cwd()))
    try:
        from benchmarks import run as bench_run
    except ImportError:
        err.print("run `agentfleet bench` from the root of an agentfleet checkout (it has benchmarks/)")
        raise typer.Exit(2) from None
    suites = [suite] if suite else list(bench_run.SUITES)
    unknown = [s for s in suites if s not in bench_run.SUITES]
    if unknown:
        raise typer.BadParameter(f"unknown suite {unknown[0]!r}; choose from {', '.join(bench_run.SUITES)}")
    logs.configure("WARNING", True)
    sizes = bench_run.Sizes.quick() if quick else bench_run.Sizes()
    report = bench_run.run(suites, sizes)
    table = Table("suite", "metric", "value", title=f"agentfleet bench ({'quick' if quick else 'full'})")
    for row in report.rows:
        table.add_row(*row)
    console = out if out.is_terminal else Console(width=200)  # a log file gets whole rows
    console.print(table)
    console.print(json.dumps(report.figures["machine"]))
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"sizes": sizes.__dict__, **report.figures}, indent=2, default=str))
    out.print(f"figures written to {target}")


@app.command()
def chaos(
    runs: Annotated[int, typer.Option("--runs", help="Goals to submit")] = 300,
    duration: Annotated[float, typer.Option("--duration", help="Seconds of faults")] = 120.0,
    kills: Annotated[int | None, typer.Option(help="Worker kills (default: one per 10 s, at least 4)")] = None,
    restarts: Annotated[bool, typer.Option("--restarts/--no-restarts",
                                           help="Restart RabbitMQ once and Postgres once (immediate)")] = True,
    settle: Annotated[float, typer.Option(help="Seconds runs may take to end after the faults")] = 300.0,
    seed: Annotated[int | None, typer.Option(help="Random seed for the choice of victims")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
) -> None:
    """Start a fleet in a private namespace, run goals with counted side effects, kill workers and restart
    the broker and the database meanwhile; print lost / duplicated / unexpected / recovered (exit 1 unless
    the first three are 0). It restarts the services it is pointed at: never run it against production."""
    from pathlib import Path

    from agentfleet.testing.chaos import Chaos, ChaosConfig

    logs.configure("WARNING", True)
    config = ChaosConfig(runs=runs, duration_s=duration, kills=kills, restart_broker=restarts,
                         restart_database=restarts, settle_s=settle, seed=seed)
    report = Chaos(get_settings(), config, cwd=Path.cwd()).run()
    if as_json:
        print(json.dumps(report.as_dict(), default=str))
    else:
        colour = "green" if report.ok else "red"
        out.print(f"[bold {colour}]lost {report.lost} · duplicated {report.duplicated} · unexpected "
                  f"{report.unexpected}[/] · recovered {report.recovered} · succeeded {report.succeeded} of "
                  f"{report.accepted} accepted ({report.runs} sent) in {report.elapsed_s:.0f}s")
        out.print(f"failed by code: {report.failed_by_code or '-'}; answered {report.answered}; side effects "
                  f"{report.side_effects}; UNKNOWN_OUTCOME in {report.unknown_outcomes} run(s); re-driven "
                  f"{report.redriven}")
        table = Table("at s", "fault", "target", "recovered in s", "note")
        for f in report.faults:
            table.add_row(f"{f.at_s:.1f}", f.kind, f.target, "-" if f.recovery_s is None else f"{f.recovery_s:.2f}",
                          f.note)
        (out if out.is_terminal else Console(width=200)).print(table)
        out.print(f"worker logs: {report.logs}")
    raise typer.Exit(0 if report.ok else 1)


ReasonOpt = Annotated[str | None, typer.Option("--reason", help="Substring of the reason or error code")]
SinceOpt = Annotated[str | None, typer.Option("--since", help="Dead for at most this long (30m, 2h, 1d) or since "
                                                             "an ISO 8601 time")]
SourceOpt = Annotated[str | None, typer.Option("--source", help="Source prefix (inbox:, task:, queue:)")]
LimitOpt = Annotated[int, typer.Option("--limit", help="Read at most this many dead letters")]


def _dead_letters() -> Any:
    from agentfleet.ops.deadletters import DeadLetterQueue

    rt = _runtime(get_settings())
    return DeadLetterQueue(rt.publisher.app, rt.topology, rt.publisher)


def _filter(ids: list[str] | None, reason: str | None, since: str | None, source: str | None) -> Any:
    from agentfleet.ops.deadletters import Filter, parse_since

    return Filter(ids=tuple(ids or ()), reason=reason, since=parse_since(since) if since else None, source=source)


def _print_outcomes(done: list[Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{**letter.summary(), "outcome": outcome} for letter, outcome in done], default=str))
        return
    for letter, outcome in done:
        out.print(f"{letter.id} {letter.error_code or '-'} {letter.source}: {outcome}")
    out.print(f"{len(done)} dead letter(s)")


@dlq_app.command("list")
def dlq_list(reason: ReasonOpt = None, since: SinceOpt = None, source: SourceOpt = None, limit: LimitOpt = 10_000,
             as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """Dead letters, oldest first, with why and where from (the queue is left as it was)."""
    letters = _dead_letters().list(_filter(None, reason, since, source), limit)
    if as_json:
        print(json.dumps([letter.summary() for letter in letters], default=str))
        return
    table = Table("id", "dead at", "code", "source", "reason", title=f"{len(letters)} dead letter(s)")
    for letter in letters:
        table.add_row(letter.id, letter.dead_at.isoformat(timespec="seconds") if letter.dead_at else "-",
                      letter.error_code or "-", letter.source, letter.reason[:120])
    (out if out.is_terminal else Console(width=220)).print(table)


@dlq_app.command("show")
def dlq_show(letter_id: Annotated[str, typer.Argument(help="Dead letter id (from dlq list)")],
             limit: LimitOpt = 10_000) -> None:
    """One dead letter: reason, code, source, where it came from, headers, properties, the head of its body."""
    letters = _dead_letters().list(_filter([letter_id], None, None, None), limit)
    if not letters:
        err.print(f"no dead letter {letter_id}")
        raise typer.Exit(2)
    print(json.dumps(letters[0].detail(), indent=2, default=str))


@dlq_app.command("replay")
def dlq_replay(
    letter_ids: Annotated[list[str] | None, typer.Argument(help="Dead letter ids")] = None,
    matching: Annotated[bool, typer.Option("--matching", help="Every dead letter the filters select")] = False,
    reason: ReasonOpt = None, since: SinceOpt = None, source: SourceOpt = None, limit: LimitOpt = 10_000,
    routing_key: Annotated[str | None, typer.Option(help="Send with this routing key instead")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Send dead letters back where they came from (a rejected goal goes through admission again)."""
    if not letter_ids and not matching:
        raise typer.BadParameter("name dead letter ids, or --matching with filters")
    done = _dead_letters().replay(_filter(letter_ids, reason, since, source), routing_key=routing_key, limit=limit)
    _print_outcomes(done, as_json)


@dlq_app.command("purge")
def dlq_purge(
    letter_ids: Annotated[list[str] | None, typer.Argument(help="Dead letter ids")] = None,
    matching: Annotated[bool, typer.Option("--matching", help="Every dead letter the filters select")] = False,
    reason: ReasonOpt = None, since: SinceOpt = None, source: SourceOpt = None, limit: LimitOpt = 10_000,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Delete dead letters for good."""
    if not letter_ids and not matching:
        raise typer.BadParameter("name dead letter ids, or --matching with filters (no filter: all)")
    match = _filter(letter_ids, reason, since, source)
    if not yes and not typer.confirm(f"delete {len(_dead_letters().list(match, limit))} dead letter(s) for good?"):
        raise typer.Exit(1)
    _print_outcomes(_dead_letters().purge(match, limit), as_json)


@ns_app.command("delete")
def namespace_delete(
    namespace: Annotated[str, typer.Argument(help="The namespace (AGENTFLEET_NAMESPACE of its fleet)")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Delete a namespace's queues and exchanges (with what they hold) and its Redis keys.

    Its runs stay in the database, which namespaces share. Stop its workers first: a live
    worker declares everything again when it restarts."""
    from kombu import Connection
    from pydantic import ValidationError

    from agentfleet.events.topology import Topology
    from agentfleet.fleet.fleet_redis import connect, forget_namespace
    from agentfleet.workers.preflight import reach_all

    try:  # the name is checked as AGENTFLEET_NAMESPACE is
        settings = Settings(namespace=namespace)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="NAMESPACE") from None
    topology = Topology(namespace)
    names = [q.name for q in topology.all_queues()] + [e.name for e in
                                                       (*topology.all_exchanges(), *topology.celery_exchanges())]
    if not yes:
        typer.confirm(f"delete {len(names)} queues and exchanges of namespace {namespace!r} (and what the queues "
                      f"hold), and its Redis keys?", abort=True)
    reach_all(settings, "broker", "redis")
    with Connection(settings.broker_url) as conn:
        topology.delete(conn)
    forgotten = forget_namespace(connect(settings), namespace) if not settings.embedded else 0
    out.print(f"deleted namespace {namespace}: {', '.join(names)}; {forgotten} Redis keys", soft_wrap=True,
              markup=False, highlight=False)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision")] = "head") -> None:
    """Create or migrate the tables (Alembic)."""
    from agentfleet.redaction import redact
    from agentfleet.store import db

    settings: Settings = get_settings()
    db.upgrade(settings.effective_database_url, revision)
    out.print(f"database at {revision}: {redact(settings.effective_database_url)}")


def main() -> None:
    with _masked_output():
        try:
            app()
        except AgentfleetError as exc:
            kind = "configuration" if isinstance(exc, ConfigurationError) else exc.code
            err.print(f"[red]error[/] {kind}: {escape(str(exc))}", soft_wrap=True)  # one line: a URL is never cut
            sys.exit(C.EXIT_UNREACHABLE if isinstance(exc, ServiceUnreachable) else C.EXIT_CONFIGURATION)


@contextlib.contextmanager
def _masked_output() -> Iterator[None]:
    """Everything this process prints passes the redactor the logs use: results, statuses, dead letters, error
    messages and tracebacks alike (``agentfleet artifacts --ref`` writes its bytes as they are, to a file or a
    pipe: that is data asked for, not output shown). The streams stay masked until the process exits: a crash's
    traceback is printed after ``main`` has returned, by the interpreter."""
    from agentfleet.redaction import RedactingStream, install_for

    with contextlib.suppress(Exception):  # settings that do not parse are the command's to report; patterns apply
        install_for(get_settings())
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()



if __name__ == "__main__":
    main()
