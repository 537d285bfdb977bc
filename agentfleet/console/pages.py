"""The console's pages (GET): runs, a run, approvals, dead letters, the fleet, activity, and sign-in.

Each reads through ``ops/`` — the same calls the CLI makes — and renders what it got; a page that shows a live
view also has a fragment route its script re-fetches when its event stream says something changed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from agentfleet import constants as C
from agentfleet.console import charts
from agentfleet.console.rendering import console_of, render
from agentfleet.errors import AgentfleetError, BadQuery
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.ops import actions
from agentfleet.ops import activity as activity_ops
from agentfleet.ops.approvals import approvals_of, pending_approvals
from agentfleet.ops.durations import parse_since
from agentfleet.ops.fleet import tools_view
from agentfleet.ops.runs import RunsQuery, runs_page
from agentfleet.ops.trace import trace_of, why_lines

DLQ_PAGE = 200  # dead letters read from the queue for one page (the queue is browsed, not consumed)
APPROVALS_PAGE = 200


def _query(request: Request) -> tuple[RunsQuery, dict[str, str]]:
    params = {k: request.query_params.get(k, "").strip() for k in ("agent", "state", "since", "goal", "cursor")}
    try:
        since = parse_since(params["since"], option="since") if params["since"] else None
    except AgentfleetError as exc:
        raise BadQuery(exc.message) from None
    query = RunsQuery(agent=params["agent"] or None, states=(params["state"].upper(),) if params["state"] else (),
                      since=since, goal_id=params["goal"] or None, cursor=params["cursor"] or None)
    return query, params


def _runs_context(request: Request) -> dict[str, Any]:
    try:
        query, params = _query(request)
        page = runs_page(console_of(request).rt.store, query)
        problem = None
    except BadQuery as exc:
        page, params, problem = None, {}, exc.message
    filters = {k: v for k, v in params.items() if k != "cursor" and v}
    return {"page": page, "params": params, "filters": filters, "problem": problem,
            "states": list(RunState.__members__), "agents": console_of(request).rt.agents.names(),
            "live": not params.get("cursor")}


def runs(request: Request) -> Response:
    context = _runs_context(request)
    return render(request, "runs.html", 400 if context["problem"] else 200, **context)


def runs_table(request: Request) -> Response:
    context = _runs_context(request)
    return render(request, "_runs_table.html", 400 if context["problem"] else 200, **context)


def _run_context(request: Request) -> dict[str, Any] | None:
    console = console_of(request)
    run_id = request.path_params["run_id"]
    trace = trace_of(console.rt.store, run_id, console.rt.agents, with_text=True)
    if trace is None:
        return None
    for iteration in trace["iterations"]:  # a graph run's path: the edges judged and the nodes that failed
        iteration["why_lines"] = [line.strip() for line in why_lines(iteration.get("why") or [])]
    approvals = approvals_of(console.rt.store, run_id)
    return {"trace": trace, "approvals": approvals, "ended": is_terminal(RunState(trace["state"])),
            "actions": actions.recent(console.rt.store, run_id=run_id),
            "error": request.query_params.get("error"), "done": request.query_params.get("done")}


def run(request: Request) -> Response:
    context = _run_context(request)
    if context is None:
        return render(request, "missing.html", 404, what=f"run {request.path_params['run_id']}")
    return render(request, "run.html", **context)


def run_body(request: Request) -> Response:
    context = _run_context(request)
    if context is None:
        return render(request, "missing.html", 404, what=f"run {request.path_params['run_id']}")
    return render(request, "_run_body.html", **context)


def _approvals_context(request: Request) -> dict[str, Any]:
    pending = []
    for record in pending_approvals(console_of(request).rt.store, limit=APPROVALS_PAGE):
        shown = record.summary()
        shown["schema"] = record.args_schema
        pending.append(shown)
    return {"pending": pending, "error": request.query_params.get("error"),
            "done": request.query_params.get("done")}


def approvals(request: Request) -> Response:
    return render(request, "approvals.html", **_approvals_context(request))


def approvals_list(request: Request) -> Response:
    return render(request, "_approvals_list.html", **_approvals_context(request))


def _dead_letters(request: Request) -> Any:
    from agentfleet.ops.deadletters import DeadLetterQueue

    rt = console_of(request).rt
    return DeadLetterQueue(rt.publisher.app, rt.topology, rt.publisher)


def dlq(request: Request) -> Response:
    from agentfleet.ops.deadletters import Filter

    try:
        letters = _dead_letters(request).list(Filter(), DLQ_PAGE)
        problem = None
    except Exception as exc:  # the broker is away: say so, as the CLI does
        letters, problem = [], f"dead letters unreadable: {exc}"
    return render(request, "dlq.html", letters=[letter.summary() for letter in letters], limit=DLQ_PAGE,
                  problem=problem, done=request.query_params.get("done"))


def dlq_letter(request: Request) -> Response:
    from agentfleet.ops.deadletters import Filter

    letter_id = request.path_params["letter_id"]
    found = _dead_letters(request).list(Filter(ids=(letter_id,)), DLQ_PAGE)
    if not found:
        return render(request, "missing.html", 404, what=f"dead letter {letter_id} (among the first {DLQ_PAGE})")
    return render(request, "dlq_letter.html", letter=found[0].detail())


def fleet(request: Request) -> Response:
    console = console_of(request)
    look = console.fleet.look()
    return render(request, "fleet.html", workers=look[1] if look else None, looked_at=look[0] if look else None,
                  tools=tools_view(console.rt), roles=list(C.ROLES), problem=console.fleet.problem,
                  done=request.query_params.get("done"), error=request.query_params.get("error"))


def activity(request: Request) -> Response:
    console = console_of(request)
    found = activity_ops.activity(console.rt.store)
    buckets = found["runs"]["buckets"]
    labels = [b["at"].strftime(activity_ops.time_format(found["runs"]["span_s"])) for b in buckets]
    samples = list(console.fleet.depths)
    depth_labels = [datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S") for at, _ in samples]
    return render(
        request, "activity.html", found=found,
        window=activity_ops.window_label(found["runs"]["start"], found["runs"]["end"]),
        runs_chart=charts.bars("runs started (failed in red)", labels, [b["runs"] for b in buckets],
                               stacked=[b["failed"] for b in buckets]),
        cost_chart=charts.bars("cost", labels, [b["cost_usd"] for b in buckets], unit=" $"),
        tokens_chart=charts.bars("tokens", labels, [b["tokens"] for b in buckets]),
        depth_chart=charts.lines("queue depth", depth_labels,
                                 {role: [d.get(role, 0) for _, d in samples] for role in C.ROLES}),
        latency=found["latency"])


def missing(request: Request, exc: Exception) -> Response:
    return render(request, "missing.html", 404, what=request.url.path)


def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


def healthz(request: Request) -> Response:
    return HTMLResponse("ok")
