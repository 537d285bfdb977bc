"""``agentfleet dlq``: dead letters listed, shown, replayed, purged."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentfleet.config.settings import get_settings

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import dlq_app
from agentfleet.cli.common import _runtime, err, out

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
    from agentfleet.ops.deadletters import Filter
    from agentfleet.ops.durations import parse_since

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
    from agentfleet.ops.actions import replay_letters, who

    done = replay_letters(_runtime(get_settings()), _filter(letter_ids, reason, since, source), by=who(None),
                          via="cli", routing_key=routing_key, limit=limit)
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
    from agentfleet.ops.actions import purge_letters, who

    _print_outcomes(purge_letters(_runtime(get_settings()), match, by=who(None), via="cli", limit=limit), as_json)
