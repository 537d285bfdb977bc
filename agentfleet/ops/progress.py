"""Following a run from its checkpoint: live progress lines, a run's description, and whether it looks stuck."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.events.contracts import Result
from agentfleet.events.publisher import queue_depths
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.roles.runtime import Runtime
from agentfleet.roles.sweeper import Action, assess
from agentfleet.store.records import ApprovalRecord, RunRecord, now
from agentfleet.store.repository import Store

# How often clients that follow a run poll its checkpoint.
FOLLOW_POLL_INTERVAL_S = 0.05


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_line(step: dict[str, Any]) -> str:
    ms = step.get("duration_ms") or 0.0
    if step["kind"] == "plan":
        notice = (step.get("input") or {}).get("notice")
        line = _plan_line(step, ms)
        return f"{line}\n  gate: {notice}" if notice else line
    result = step.get("output") or {}
    call = f"{step['name']}({_short(step.get('input') or {})})"
    if step["status"] == "delegated":  # answered when the child run ends (agentfleet status shows the tree)
        return f"  → {call} handed to run {result.get('child_run_id')}"
    if step["status"] == "succeeded":
        source = "cache hit" if result.get("cache_hit") else f"{ms:.1f} ms"
        return f"  ✓ {call} {source} [{step.get('worker') or '?'}]"
    return f"  ✗ {call} {result.get('error_code')}: {result.get('message')}"


def _plan_line(step: dict[str, Any], ms: float) -> str:
    output = step.get("output") or {}
    if step["status"] != "succeeded":
        return f"iteration {step['iteration']}: model failed: {output.get('message', '')}"
    names = output.get("calls", [])
    if output.get("repair"):
        return f"iteration {step['iteration']}: model → unusable answer, told back: {output['repair']} ({ms:.0f} ms)"
    if FINAL_ANSWER_TOOL in names:
        return f"iteration {step['iteration']}: model → final answer ({ms:.0f} ms)"
    if not names:
        return f"iteration {step['iteration']}: model → an answer without tool calls ({ms:.0f} ms)"
    what = "1 tool call" if len(names) == 1 else f"{len(names)} tool calls in parallel"
    return f"iteration {step['iteration']}: model → {what} ({ms:.0f} ms)"


def notice_line(notice: dict[str, Any], root_run_id: str) -> str | None:
    """A progress line from a notice on ``<ns>.public`` (``submit --wait`` follows these, not the database); a
    child run's lines name it. None: nothing worth a line."""
    kind = notice.get("type")
    who = "" if notice.get("run_id") == root_run_id else f"[{notice.get('agent')} {str(notice.get('run_id'))[:12]}] "
    if kind == "step.planned":
        calls = [c.get("name") for c in notice.get("calls") or []]
        tokens = f"{notice.get('input_tokens', 0)}+{notice.get('output_tokens', 0)} tokens"
        ms = float(notice.get("duration_ms") or 0)
        if FINAL_ANSWER_TOOL in calls:
            what = "final answer"
        elif not calls:
            what = "an answer without tool calls"
        else:
            what = ", ".join(f"{c.get('name')}({_short(c.get('arguments') or {})})" for c in notice["calls"])
        return f"{who}iteration {notice.get('iteration')}: model → {what} ({ms:.0f} ms, {tokens})"
    if kind == "tool.started":
        return f"  {who}… {notice.get('tool')} started [{notice.get('worker')}]"
    if kind == "tool.finished":
        ms = f"{float(notice.get('duration_ms') or 0):.1f} ms"
        if notice.get("ok"):
            return f"  {who}✓ {notice.get('tool')} {ms}"
        return f"  {who}✗ {notice.get('tool')} {notice.get('error_code')} {ms}"
    if kind == "run.waiting":
        return f"  {who}⏸ waiting for {'a person' if notice.get('waiting_for') == 'approval' else 'its children'}"
    if kind == "approval.requested":
        return (f"  {who}⏸ {notice.get('tool')}({_short(notice.get('arguments') or {})}) waits for a person: "
                f"{notice.get('reason')} (agentfleet approve {notice.get('run_id')} {notice.get('call_id')})")
    if kind == "approval.resolved":
        return f"  {who}{notice.get('decision')} {notice.get('tool')} by {notice.get('by')}"
    if kind in ("run.completed", "run.failed") and who:
        code = notice.get("error_code")
        return f"  {who}ended {notice.get('status')}{f': {code}' if code else ''}"
    if kind == "graph.step":
        return f"  {who}graph step {notice.get('step')}: {', '.join(notice.get('nodes') or []) or 'end'}"
    return None


def wait_for_end(store: Store, run_id: str, *, timeout_s: float,
                 on_poll: Callable[[RunRecord | None], None] | None = None) -> RunRecord | None:
    """Poll the run's checkpoint until it ends (its record, Result stored) or ``timeout_s`` passes (None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = store.get_run(run_id)
        if on_poll is not None:
            on_poll(run)
        if run is not None and is_terminal(run.state) and run.result:
            return run
        if time.monotonic() > deadline:
            return None
        time.sleep(FOLLOW_POLL_INTERVAL_S)


def approval_line(record: ApprovalRecord, embedded: bool) -> str:
    flag = " --embedded" if embedded else ""
    expires = f", expires {record.expires_at.isoformat(timespec='seconds')}" if record.expires_at else ""
    return (f"  ⏸ {record.tool}({_short(record.shown)}) waits for a person: {record.reason} [{record.rule}{expires}]\n"
            f"    agentfleet approve{flag} {record.run_id} {record.call_id}   or   agentfleet deny{flag} "
            f"{record.run_id} {record.call_id} --reason ...")


class Progress:
    """Prints each finished step of a run (and each wait for a person) once, however often it is asked to."""

    def __init__(self, store: Store, run_id: str, console: Console, *, embedded: bool = False) -> None:
        self.store, self.run_id, self.console, self.embedded = store, run_id, console, embedded
        self.shown: set[int | str] = set()

    def show(self, run: RunRecord | None = None) -> None:
        run = run or self.store.get_run(self.run_id)
        if run is None:
            return
        for step in self.store.steps(self.run_id):
            if step["id"] not in self.shown and step["status"] != "started":
                self.shown.add(step["id"])
                self.console.print(escape(step_line(step)))
        if run.state == RunState.WAITING_APPROVAL:
            for record in self.store.pending_approvals(run_id=self.run_id):
                if record.approval_id not in self.shown:
                    self.shown.add(record.approval_id)
                    self.console.print(escape(approval_line(record, self.embedded)))


def follow(store: Store, run_id: str, console: Console | None, *, timeout_s: float,
           embedded: bool = False) -> Result | None:
    """Wait for the run's Result, printing its progress to ``console``; None if the wait ran out first."""
    progress = Progress(store, run_id, console, embedded=embedded) if console is not None else None
    ended = wait_for_end(store, run_id, timeout_s=timeout_s, on_poll=progress.show if progress else None)
    return None if ended is None else Result.model_validate(ended.result)


def describe_run(store: Store, run_id: str) -> dict[str, Any] | None:
    run = store.get_run(run_id)
    if run is None:
        return None
    return {
        "run_id": run.run_id,
        "agent": run.agent,
        "goal_id": run.goal_id,
        "state": run.state.value,
        "iteration": run.iteration,
        "usage": run.usage_summary(),
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "result": run.result,
        "steps": store.steps(run_id),
        "approvals": [a.summary() for a in store.approvals_of(run_id)],
        "parent_run_id": run.parent_run_id,
        "lineage": run.lineage, "thread_id": run.thread_id,
        "children": run_tree(store, run_id),
    }


def run_status(rt: Runtime, run_id: str) -> dict[str, Any] | None:
    """A run's description (``describe_run``) with ``stuck``: how long it has been quiet and what the sweeper will
    do about it, as the sweeper itself would judge it now, or None while it shows signs of life."""
    described = describe_run(rt.store, run_id)
    run = rt.store.get_run(run_id)
    if described is None or run is None:
        return None
    # an embedded fleet's queues live in its process
    ready = {} if rt.settings.embedded else queue_depths(rt.publisher.app, rt.topology)
    assessed = assess(rt, run, now(), ready)
    stuck = None
    if assessed is not None and assessed[1].action != Action.WAIT:
        stuck = {"quiet_s": round(assessed[0], 1), "action": assessed[1].action.value, "reason": assessed[1].reason}
    described["stuck"] = stuck
    return described


def run_tree(store: Store, run_id: str, depth: int = 0) -> list[dict[str, Any]]:
    """The runs a run's delegations started, and theirs (a tree), with what started each and what it spent."""
    if depth > MAX_TREE_DEPTH:
        return []
    return [{"run_id": c.run_id, "agent": c.agent, "state": c.state.value, "usage": c.usage_summary(),
             "error_code": c.error_code, "started_by": f"call {(c.parent or {}).get('call_id')} "
                                                       f"(iteration {(c.parent or {}).get('iteration')})",
             "children": run_tree(store, c.run_id, depth + 1)}
            for c in store.children(run_id)]


MAX_TREE_DEPTH = 32
