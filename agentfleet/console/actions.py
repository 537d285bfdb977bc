"""What a person does from the console (POST, each with its CSRF token): answer an approval, cancel a run,
replay a dead letter, scale a role. Each goes through ``ops.actions`` — the CLI's own path — which records who
did it; the page is then shown again with what came of it (POST, redirect, GET)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from agentfleet import constants as C
from agentfleet.console.forms import checked_form, text
from agentfleet.console.rendering import console_of, user_of
from agentfleet.errors import AgentfleetError
from agentfleet.ops import actions
from agentfleet.ops.deadletters import Filter

T = TypeVar("T")


def _back(path: str, **said: str) -> Response:
    return RedirectResponse(f"{path}?{urlencode(said)}" if said else path, status_code=303)


def _actor(request: Request) -> str:
    user = user_of(request)
    if user is None:  # the gate lets nobody here unsigned; a session cleared mid-request is still nobody
        raise AgentfleetError("nobody is signed in")
    return user


async def answer_approval(request: Request) -> Response:
    form = await checked_form(request)
    run_id, call_id = request.path_params["run_id"], request.path_params["call_id"]
    decision = text(form, "decision", 32)
    note = text(form, "note") or None
    back = text(form, "back", 200)
    back = back if back in ("/approvals", f"/runs/{run_id}") else "/approvals"
    if decision not in ("approve", "deny", "approve_edited"):
        return _back(back, error="answer approve, approve with edits, or deny")
    if decision == "deny" and not note:
        return _back(back, error="a denial needs a reason (the model is told it)")
    rt = console_of(request).rt
    edited = None
    if decision == "approve_edited":
        try:
            edited = json.loads(text(form, "arguments", 60_000))
        except ValueError as exc:
            return _back(back, error=f"edited arguments are not JSON: {exc}")
        if not isinstance(edited, dict):
            return _back(back, error="edited arguments must be a JSON object")
    try:
        reply = await _in_thread(lambda: actions.answer_approval(
            rt, run_id=run_id, call_id=call_id, decision="deny" if decision == "deny" else "approve",
            by=_actor(request), via="console", note=note, arguments=edited))
    except AgentfleetError as exc:
        return _back(back, error=exc.message)
    if reply.status != "accepted":
        return _back(back, error=f"{reply.error_code}: {reply.message}")
    return _back(back, done=f"{reply.decision} {call_id} of run {run_id}")


async def cancel(request: Request) -> Response:
    form = await checked_form(request)
    run_id = request.path_params["run_id"]
    reason = text(form, "reason", 500) or "cancelled from the console"
    rt = console_of(request).rt
    await _in_thread(lambda: actions.cancel_run(rt, run_id, reason, by=_actor(request), via="console"))
    return _back(f"/runs/{run_id}", done="cancel requested")


async def replay(request: Request) -> Response:
    await checked_form(request)
    letter_id = request.path_params["letter_id"]
    rt = console_of(request).rt
    done = await _in_thread(lambda: actions.replay_letters(rt, Filter(ids=(letter_id,)), by=_actor(request),
                                                           via="console"))
    if not done:
        return _back("/dlq", done=f"no dead letter {letter_id} any more")
    return _back("/dlq", done="; ".join(f"{letter.id}: {outcome}" for letter, outcome in done))


async def scale(request: Request) -> Response:
    form = await checked_form(request)
    role = text(form, "role", 32)
    try:
        total = int(text(form, "total", 8))
    except ValueError:
        return _back("/fleet", error="threads must be a whole number")
    if role not in C.ROLES or not 1 <= total <= 1000:
        return _back("/fleet", error=f"scale one of {', '.join(C.ROLES)} to 1..1000 threads")
    rt = console_of(request).rt
    try:
        done = await _in_thread(lambda: actions.scale_role(rt.publisher.app, rt.topology, role, total,
                                                           by=_actor(request), via="console", store=rt.store))
    except AgentfleetError as exc:
        return _back("/fleet", error=exc.message)
    return _back("/fleet", done="; ".join(f"{r.name}: {r.before} → {r.after if r.after is not None else '?'}"
                                          for r in done))


async def _in_thread(work: Callable[[], T]) -> T:
    """Blocking work (the database, the broker) off the event loop."""
    return await run_in_threadpool(work)
