"""What an operator may do to the fleet — answer an approval, cancel a run, replay a dead letter, scale a role —
one function each, shared by the CLI, the Python client and the console, and each kept in the operators' trail
(``operator_actions``) with who did it, by which way, and what came of it, accepted or refused.

Recording is after the attempt and never fails it: an action that happened and could not be written down is
logged, not undone (the run's own audit rows and the approval's ``resolved_by`` still say what moved).
"""

from __future__ import annotations

import getpass
import logging
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import ValidationError

from agentfleet.errors import AgentfleetError, ApprovalRefused, ErrorCode
from agentfleet.events.contracts import ApprovalAnswer, ApprovalResolve
from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.redaction import redact
from agentfleet.roles.approvals import resolve
from agentfleet.roles.runtime import Runtime
from agentfleet.store.repository import Store

log = logging.getLogger(__name__)

Via = Literal["console", "cli", "client"]


def who(by: str | None) -> str:
    """The actor: as given, else this process's OS user (what the CLI has always recorded)."""
    return by or getpass.getuser()


def record(store: Store, *, actor: str, via: Via, action: str, target: str, outcome: str,
           detail: dict[str, Any], run_id: str | None = None) -> None:
    try:
        store.record_action(actor=actor, via=via, action=action, target=target, outcome=outcome,
                            detail=redact(detail), run_id=run_id)
    except Exception as exc:  # the trail is a record of the act, not a condition of it
        log.warning("operator action not recorded: %s", exc, extra={"action": action, "target": target})


def recent(store: Store, *, run_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The operators' trail, newest first: a run's own, or everyone's."""
    return store.actions(run_id=run_id, limit=limit)


def answer_approval(rt: Runtime, *, run_id: str, call_id: str, decision: str, by: str, via: Via,
                    note: str | None = None, arguments: dict[str, Any] | None = None,
                    publish: bool = True) -> ApprovalAnswer:
    """A person's answer to a parked call: accepted, or refused with a code (never raised). Edited arguments are
    checked against the tool's schema (the request stays pending when they break it)."""
    try:
        asked = ApprovalResolve(run_id=run_id, call_id=call_id, decision=decision,  # type: ignore[arg-type]
                                note=note, arguments=arguments, by=by)
    except ValidationError as exc:
        problem = exc.errors()[0]
        raise AgentfleetError(f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}",
                              code=ErrorCode.INVALID_ARGUMENTS) from None
    try:
        reply = resolve(rt, asked, by, publish=publish)
    except ApprovalRefused as exc:
        reply = ApprovalAnswer.rejection(exc.code, exc.message, run_id=run_id, call_id=call_id)
    record(rt.store, actor=by, via=via, action=decision, target=f"{run_id} {call_id}", run_id=run_id,
           outcome=reply.status, detail={"note": note, "edited": arguments is not None,  # the approval keeps them
                                          "error_code": reply.error_code, "message": reply.message})
    return reply


def cancel_run(rt: Runtime, run_id: str, reason: str, *, by: str, via: Via) -> None:
    """Ask the fleet to cancel a run and everything under it (its Result says ``cancelled``)."""
    event = Envelope.new(EventType.RUN_CANCEL_REQUESTED, run_id, RunCancelRequested(reason=reason),
                         trace_id=uuid.uuid4().hex)
    _recorded(rt.store, by, via, "cancel", run_id, {"reason": reason}, lambda: rt.publisher.publish([event]),
              run_id=run_id)


def replay_letters(rt: Runtime, match: Any, *, by: str, via: Via, routing_key: str | None = None,
                   limit: int | None = None) -> list[tuple[Any, str]]:
    """Send the dead letters ``match`` (an ``ops.deadletters.Filter``) selects back where they came from; each
    letter and what became of it."""
    return _on_letters(rt, match, by=by, via=via, action="replay", limit=limit,
                       act=lambda queue, lim: queue.replay(match, routing_key=routing_key, limit=lim),
                       detail={"routing_key": routing_key})


def purge_letters(rt: Runtime, match: Any, *, by: str, via: Via, limit: int | None = None) -> list[tuple[Any, str]]:
    """Delete the dead letters ``match`` selects for good."""
    return _on_letters(rt, match, by=by, via=via, action="purge", limit=limit,
                       act=lambda queue, lim: queue.purge(match, lim), detail={})


def _on_letters(rt: Runtime, match: Any, *, by: str, via: Via, action: str, limit: int | None,
                act: Callable[[Any, int], list[tuple[Any, str]]], detail: dict[str, Any]) -> list[tuple[Any, str]]:
    from agentfleet.ops.deadletters import DEFAULT_LIMIT, DeadLetterQueue

    queue = DeadLetterQueue(rt.publisher.app, rt.topology, rt.publisher)
    done = act(queue, limit or DEFAULT_LIMIT)
    asked = {"ids": list(match.ids), "reason": match.reason, "source": match.source,
             "since": match.since.isoformat() if match.since else None}
    record(rt.store, actor=by, via=via, action=action, target=(",".join(match.ids) or "matching")[:255],
           outcome="accepted" if done else "refused",
           detail={**detail, "asked": asked, "done": [{"id": letter.id, "outcome": o} for letter, o in done]})
    return done


def scale_role(app: Any, topology: Any, role: str, total: int, *, by: str, via: Via, store: Store,
               timeout_s: float = 2.0) -> list[Any]:
    """Set a role's total pool size over its live workers; what each worker confirmed. Needs the broker (and the
    database for the record), not the agents' code: an operator's machine may not have it."""
    from agentfleet.ops.control import scale

    found: list[Any] = []

    def act() -> None:
        found.extend(scale(app, topology, role, total, timeout_s))

    _recorded(store, by, via, "scale", role, {"total": total}, act,
              result=lambda: {"workers": [{"name": r.name, "before": r.before, "after": r.after} for r in found]})
    return found


def trail(settings: Any) -> Store:
    """A store for the operators' trail alone, on the fleet's database, without the runtime (which loads the
    agents' code)."""
    from agentfleet.store import make_engine

    return Store(make_engine(settings.effective_database_url))


def _recorded(store: Store, by: str, via: Via, action: str, target: str, detail: dict[str, Any],
              act: Callable[[], None], *, run_id: str | None = None,
              result: Callable[[], dict[str, Any]] | None = None) -> None:
    try:
        act()
    except Exception as exc:
        record(store, actor=by, via=via, action=action, target=target, run_id=run_id, outcome="failed",
               detail={**detail, "error": str(exc)})
        raise
    record(store, actor=by, via=via, action=action, target=target, run_id=run_id, outcome="accepted",
           detail={**detail, **(result() if result else {})})

