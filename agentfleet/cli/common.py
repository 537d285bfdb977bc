"""What every command group shares: the consoles, option types, settings, the runtime, printing a Result."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from agentfleet.config.settings import Settings, get_settings
from agentfleet.events.contracts import Result, ResultStatus

if TYPE_CHECKING:
    pass


out = Console()


err = Console(stderr=True)


AgentArg = Annotated[str, typer.Argument(help="Agent name")]


InputOpt = Annotated[str, typer.Option("--input", "-i", help="Goal input as JSON")]


GoalIdOpt = Annotated[str | None, typer.Option(help="Idempotency key (default: new)")]
ThreadOpt = Annotated[str | None, typer.Option("--thread", help="Continue this conversation (a thread id: the run "
                                                                "starts from what its earlier runs left)")]


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


def _goal(agent: str, input_json: str, goal_id: str | None, max_steps: int | None,
          thread: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": _json_arg(input_json, "--input")}
    if goal_id:
        body["goal_id"] = goal_id
    if thread:
        body["thread_id"] = thread
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


def _runtime(settings: Settings) -> Any:
    """The fleet's runtime, once its database answers (tried for AGENTFLEET_CONNECT_TIMEOUT_S, else exit 69)."""
    from agentfleet.roles.runtime import runtime_for
    from agentfleet.workers.app import create_app
    from agentfleet.workers.preflight import reach_all

    reach_all(settings, "database")
    if settings.embedded:  # this machine's own SQLite file: a command may be the first to open it
        from agentfleet.store import db

        db.upgrade(settings.effective_database_url)
    return runtime_for(create_app(settings))


EmbeddedOpt = Annotated[bool, typer.Option("--embedded", help="A run of `agentfleet run` (the embedded fleet's "
                                                           "SQLite database in this directory)")]


def _settings(embedded: bool) -> Settings:
    settings = get_settings()
    return settings.with_profile("embedded") if embedded else settings
