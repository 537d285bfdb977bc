"""What happened to a run, and why, from its checkpoint: the data of ``agentfleet trace``, and its lines.

Read from three records the fleet keeps anyway: the steps (each model turn and tool
call, with duration, worker and attempts), the audit trail (each state transition and
what caused it) and the run's Result. Tool arguments are shown with secrets masked
(by the tool's schema where the agent is loaded here, else by name), and the whole timeline is masked
as logs are (harness/redaction.py).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from agentfleet.agents.registry import AgentRegistry
from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.loop.states import is_terminal
from agentfleet.redaction import redact
from agentfleet.store.records import RunRecord
from agentfleet.store.repository import Store


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat(timespec="milliseconds") if ts else None


def _model_turn(step: dict[str, Any]) -> dict[str, Any]:
    output = step.get("output") or {}
    usage = output.get("usage") or {}
    calls = output.get("calls") or []
    if step["status"] != "succeeded":
        decision = f"failed: {output.get('error_code')}: {output.get('message')}"
    elif FINAL_ANSWER_TOOL in calls:
        decision = "final answer"
    else:
        decision = f"{len(calls)} tool call{'s' if len(calls) != 1 else ''}: {', '.join(calls)}"
    return {"kind": "model", "at": _iso(step.get("started_at")), "model": output.get("model"),
            "status": step["status"], "decision": decision, "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0), "cost_usd": usage.get("cost_usd", 0.0),
            "duration_ms": step.get("duration_ms"), "worker": step.get("worker"), "attempts": step.get("attempts"),
            "gate_notice": (step.get("input") or {}).get("notice"),
            "context": output.get("context") if isinstance(output.get("context"), dict) else None}


def context_line(context: dict[str, Any]) -> str:
    """One model call's context: tokens by part against the prompt's budget, and what was compacted."""
    tokens = context.get("tokens") or {}
    parts = ", ".join(f"{part} {n}" for part, n in tokens.items() if n)
    exact = f", {context['exact']} counted exactly" if context.get("exact") is not None else ""
    line = f"    context: {context.get('total')} of {context.get('prompt')} tokens ({parts}){exact}"
    compacted = context.get("compacted") or {}
    if compacted:
        said = {"results": "old results to references", "turns": "turns to summary lines",
                "omitted": "summary lines omitted"}
        line += "; compacted " + ", ".join(f"{n} {said.get(k, k)}" for k, n in compacted.items())
    return line


def _tool_call(step: dict[str, Any], schema: dict[str, Any] | None) -> dict[str, Any]:
    result = step.get("output") or {}
    arguments = step.get("input") if isinstance(step.get("input"), dict) else {}
    return {"kind": "tool", "at": _iso(step.get("started_at")), "call_id": step.get("call_id"),
            "tool": step.get("name"), "arguments": redact(arguments or {}, schema), "status": step["status"],
            "ok": result.get("ok"), "error_code": result.get("error_code"), "message": result.get("message"),
            "cache_hit": bool(result.get("cache_hit")), "approval": result.get("approval"),
            "child_run_id": result.get("child_run_id"), "duration_ms": step.get("duration_ms"),
            "worker": step.get("worker"), "attempts": step.get("attempts")}


def trace_of(store: Store, run_id: str, agents: AgentRegistry | None = None, *, with_text: bool = False
             ) -> dict[str, Any] | None:
    """The run's timeline by iteration, its transitions and its end; None if there is no such run. ``with_text``:
    each model turn also carries the head of what the model said in words (the console shows it)."""
    run = store.get_run(run_id)
    if run is None:
        return None
    agent = agents.get(run.agent) if agents else None
    iterations: dict[int, dict[str, Any]] = {}
    for step in store.steps(run_id):
        entry = iterations.setdefault(step["iteration"], {"iteration": step["iteration"], "model": None, "tools": []})
        if step["kind"] == "plan":
            entry["model"] = _model_turn(step)
        else:
            tool = agent.tools.get(step.get("name") or "") if agent else None
            entry["tools"].append(_tool_call(step, tool.parameters if tool else None))
    if getattr(agent, "graph", None) is not None:  # a graph's turns say why: the edges judged, the nodes failed
        for said in _graph_reasons(store.transcript(run_id)):
            if said["step"] in iterations:
                iterations[said["step"]]["why"] = said["path"]
    elif with_text:  # what the model said in words, beside its calls (a graph's turn text is its path, above)
        for iteration, text in store.turn_texts(run_id).items():
            if iteration in iterations and iterations[iteration]["model"] is not None:
                iterations[iteration]["model"]["text"] = text
    transitions = [{"at": _iso(t["at"]), "from": t["from_state"], "to": t["to_state"], "event": t["event_type"],
                    "reason": t["reason"], "worker": t["worker"], "step_ms": t["step_duration_ms"]}
                   for t in store.audit_trail(run_id)]
    # Shown to people: masked throughout (a tool's error or the end message may quote what it was given).
    return redact({"run_id": run.run_id, "agent": run.agent, "goal_id": run.goal_id, "trace_id": run.trace_id,
                   "state": run.state.value, "created_at": _iso(run.created_at), "updated_at": _iso(run.updated_at),
                   "lineage": run.lineage, "thread_id": run.thread_id,
                   "usage": _usage(run), "iterations": [iterations[i] for i in sorted(iterations)],
                   "transitions": transitions, "end": _end(run), "tree": tree_of(store, run.trace_id)})


def _graph_reasons(messages: list[Any]) -> list[dict[str, Any]]:
    """Each graph turn's record of how it chose its nodes (graphs/binding.py writes it as the turn's text), read
    strictly: a text that is not one is skipped."""
    found = []
    for m in messages:
        if m.role != "assistant" or not m.content:
            continue
        try:
            said = json.loads(m.content)
        except ValueError:
            continue
        if isinstance(said, dict) and isinstance(said.get("step"), int) and isinstance(said.get("path"), list):
            found.append({"step": said["step"], "path": [p for p in said["path"] if isinstance(p, dict)]})
    return found


def why_lines(path: list[dict[str, Any]]) -> list[str]:
    """A graph step's reasons: each node that failed and what followed, each edge judged and whether it held."""
    lines = []
    for record in path:
        for f in record.get("failed") or []:
            lines.append(f"    node {f.get('node')} failed (try {f.get('attempt')}): {f.get('error_code')}: "
                         f"{f.get('message')} → {f.get('then')}")
        if record.get("from"):
            lines.append(f"    forked: starts at {record['from']}")
        for e in record.get("edges") or []:
            because = f" ({e['because']})" if e.get("because") else ""
            items = f", {e['items']} item(s)" if "items" in e else ""
            waiting = f", waiting for {', '.join(e['waiting_for'])}" if e.get("waiting_for") else ""
            lines.append(f"    edge {e.get('from')} → {e.get('to')}{because}: "
                         f"{'taken' if e.get('took') else 'not taken'}{items}{waiting}")
    return lines


def tree_of(store: Store, trace_id: str) -> list[dict[str, Any]]:
    """Every run of a trace (one goal's whole collaboration), as a forest: delegated runs under the run whose
    call they answer, triggered runs under the run whose event started them, each with what started it."""
    runs = store.runs_in_trace(trace_id)
    ids = {r.run_id for r in runs}

    def started_by(r: RunRecord) -> tuple[str | None, str]:
        if r.parent:
            return r.parent_run_id, f"delegate call {r.parent.get('call_id')}"
        if r.cause:
            origin = r.cause.get("run_id")
            return origin, f"event {r.cause.get('event')} ({r.cause.get('source')})"
        return None, "goal"

    nodes = {r.run_id: {"run_id": r.run_id, "agent": r.agent, "state": r.state.value, "usage": _usage(r),
                        "error_code": r.error_code, "started_by": started_by(r)[1], "children": []} for r in runs}
    roots = []
    for r in runs:
        above, _ = started_by(r)
        (nodes[above]["children"] if above in ids else roots).append(nodes[r.run_id])
    return roots


def _usage(run: RunRecord) -> dict[str, Any]:
    return {"steps": run.steps_used, "input_tokens": run.input_tokens, "output_tokens": run.output_tokens,
            "cost_usd": run.cost_usd}


def _end(run: RunRecord) -> dict[str, Any] | None:
    if not run.result:
        return None
    return {key: run.result.get(key) for key in ("status", "error_code", "message", "recovery_suggestion")}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def trace_lines(trace: dict[str, Any]) -> list[str]:
    """The timeline as plain lines: nothing is cut to a terminal's width, so it reads the same piped."""
    usage = trace["usage"]
    lines = [f"run {trace['run_id']}  agent {trace['agent']}  {trace['state']}  started {trace['created_at']}",
             f"  goal_id {trace['goal_id']}  trace_id {trace['trace_id']}",
             f"  usage: {usage['steps']} model turns, {usage['input_tokens']} in + {usage['output_tokens']} out "
             f"tokens, ${usage['cost_usd']:.6f}"]
    if trace.get("lineage"):
        lineage = trace["lineage"]
        lines.append(f"  {'retry' if lineage['kind'] == 'retry' else 'fork'} of run {lineage['run_id']}: its "
                     f"iterations through {lineage['through']} are this run's start (agentfleet trace "
                     f"{lineage['run_id']})")
    if trace.get("thread_id"):
        lines.append(f"  thread {trace['thread_id']}")
    for it in trace["iterations"]:
        lines.append(f"iteration {it['iteration']}")
        model = it["model"]
        if model is not None:
            retried = f", attempt {model['attempts']}" if (model["attempts"] or 1) > 1 else ""
            lines.append(f"  model {model['model'] or '?'} → {model['decision']}  ({_ms(model['duration_ms'])}, "
                         f"{model['input_tokens']} in / {model['output_tokens']} out tokens, "
                         f"${model['cost_usd']:.6f}, {model['worker'] or '?'}{retried})")
            if model.get("context") and "total" in model["context"]:
                lines.append(context_line(model["context"]))
            lines += why_lines(it.get("why") or [])
            if model["gate_notice"]:
                lines.append(f"    gate: {model['gate_notice']}")
        for call in it["tools"]:
            args = json.dumps(call["arguments"], default=str, separators=(",", ":"))
            if call["status"] == "started":
                outcome = "running (or its worker died mid-call)"
            elif call["status"] == "delegated":
                outcome = f"handed to run {call['child_run_id']} (answered when it ends)"
            elif call["ok"]:
                outcome = "ok" + (" (cache hit)" if call["cache_hit"] else "")
            else:
                outcome = f"{call['error_code']}: {call['message']}"
            approved = f", approved by {call['approval'].get('by')}" if call["approval"] else ""
            lines.append(f"  tool {call['tool']}({args}) [{call['call_id']}] → {outcome}  "
                         f"({_ms(call['duration_ms'])}, {call['worker'] or '?'}, attempt {call['attempts']}{approved})")
    if trace["transitions"]:
        lines.append("transitions")
        for t in trace["transitions"]:
            cause = f" on {t['event']}" if t["event"] else " (sweeper or CLI)"
            reason = f" reason {t['reason']}" if t["reason"] else ""
            lines.append(f"  {t['at']}  {t['from']} → {t['to']}{cause}{reason}  [{t['worker']}]")
    if len(trace.get("tree") or []) > 1 or any(n["children"] for n in trace.get("tree") or []):
        lines.append(f"runs of trace {trace['trace_id']}")
        lines += _tree_lines(trace["tree"], "  ")
    end = trace["end"]
    if end:
        lines.append(f"end: {end['status']}" + (f" {end['error_code']}: {end['message']}" if end["error_code"] else ""))
        if end.get("recovery_suggestion"):
            lines.append(f"  what to do: {end['recovery_suggestion']}")
    return lines


def _tree_lines(nodes: list[dict[str, Any]], indent: str) -> list[str]:
    out = []
    for n in nodes:
        u = n["usage"]
        code = f" {n['error_code']}" if n["error_code"] else ""
        out.append(f"{indent}{n['agent']} {n['run_id']} {n['state']}{code}  {u['steps']} turns, "
                   f"{u['input_tokens'] + u['output_tokens']} tokens, ${u['cost_usd']:.6f}  ← {n['started_by']}")
        out += _tree_lines(n["children"], indent + "  ")
    return out


def settle_trace(store: Store, run_id: str, timeout: float) -> list[str]:
    """Wait until the runs a goal started (delegated, triggered by its events) have ended, and the lines that show
    them (none when it started nothing). Settled when every run of the trace has ended twice running: an embedded
    fleet ends with the command that started it, so it must not stop while its runs still go on."""
    run = store.get_run(run_id)
    if run is None or (len(store.runs_in_trace(run.trace_id)) < 2 and not store.domain_events(run_id=run_id)):
        return []  # it started nothing: nothing to wait for
    deadline, settled, last = time.monotonic() + timeout, 0, None
    while settled < 2 and time.monotonic() < deadline:
        runs = store.runs_in_trace(run.trace_id)
        now_seen = [(r.run_id, r.state) for r in runs]
        settled = settled + 1 if now_seen == last and all(is_terminal(r.state) for r in runs) else 0
        last = now_seen
        time.sleep(0.25)
    found = trace_of(store, run_id)
    if found is None or len(store.runs_in_trace(run.trace_id)) < 2:
        return []
    lines = trace_lines(found)
    start = next((i for i, line in enumerate(lines) if line.startswith("runs of trace")), None)
    shown: list[str] = []
    for line in lines[start:] if start is not None else []:
        if line.startswith("end:"):
            break
        shown.append(line)
    return shown
