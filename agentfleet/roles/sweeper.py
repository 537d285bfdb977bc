"""The stuck-run sweeper: finds quiet runs and re-drives them from their last checkpoint.

One sweep at a time fleet-wide (an advisory lock taken for the sweep; a sweep that finds
it taken does nothing). Every move it makes is one a late message could also make, and
the compare-and-set transitions and per-consumer dedupe make the two harmless together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentfleet.errors import RECOVERY_SUGGESTIONS, ErrorCode
from agentfleet.events.contracts import ResultStatus
from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted, decode, stored_outbox
from agentfleet.events.publisher import queue_depths
from agentfleet.loop.recovery import Action, Redrive, plan_redrive, waiting_in_line, waiting_within_deadline
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.roles.retry import is_transient
from agentfleet.roles.runtime import Runtime
from agentfleet.roles.step import ended_event, result_of
from agentfleet.store.records import RunRecord, now

SWEEP_BATCH = 200  # runs one sweep acts on at most
SWEEP_PAGE = 500  # quiet runs read per query


log = logging.getLogger(__name__)
SWEEP_LOCK = "agentfleet/sweeper"
SWEEPER = "sweeper"  # the consumer name its own stored outboxes carry


@dataclass(frozen=True)
class Finding:
    """A quiet run and what the sweeper did (or, in a dry run, would do) about it."""

    run_id: str
    agent: str
    state: str
    iteration: int
    quiet_s: float
    action: Action
    reason: str
    events: int


def assess(rt: Runtime, run: RunRecord, at: datetime, ready: dict[str, int]) -> tuple[float, Redrive] | None:
    """How long the run has been quiet and what to do, or None while it shows signs of life or waits its turn."""
    limits = run.limits or {}
    deadline_s = float(limits.get("deadline_s", float("inf")))
    elapsed_s = (at - run.began_at).total_seconds()
    if run.state == RunState.PENDING and run.thread_id and rt.store.waits_for_thread(run):
        return None  # its thread's run before it is still going: its turn comes with that run's end
    if waiting_in_line(run.state, ready) or waiting_within_deadline(run.state, elapsed_s, deadline_s,
                                                                    rt.settings.stall_after_s):
        return None  # checked first: no query per run while a queue has a backlog, or while it waits
    quiet = (at - rt.store.last_activity(run)).total_seconds()
    if quiet < rt.settings.stall_after_s:
        return None
    live = not is_terminal(run.state)
    in_flight = live and any(rt.store.step_held(k) for k in rt.store.open_steps(run.run_id))
    owes = not live and bool(rt.store.pending_replies(run.run_id))
    plan = plan_redrive(state=run.state, iteration=run.iteration, elapsed_s=elapsed_s, deadline_s=deadline_s,
                        grace_s=rt.settings.stall_after_s,
                        in_flight=in_flight, owes_result=owes, stored=rt.store.stored_events(run.run_id))
    return quiet, plan


def sweep(rt: Runtime, *, dry_run: bool = False, at: datetime | None = None, limit: int = SWEEP_BATCH
          ) -> list[Finding] | None:
    """One pass over the quiet runs, acting on at most ``limit``; None when another sweeper holds the claim."""
    at = at or now()
    with rt.store.step_lock(SWEEP_LOCK) as claimed:
        if not claimed:
            return None
        ready = queue_depths(rt.publisher.app, rt.topology)
        findings: list[Finding] = []
        # Pages are keyed on updated_at, which a re-drive makes move: a run moved between two reads to a time
        # still before the cut-off (a worker's clock behind the sweeper's) is on the next page again. Once a pass.
        seen: set[str] = set()
        before, after = at - timedelta(seconds=rt.settings.stall_after_s), None
        while len(findings) < limit and (page := rt.store.quiet_runs(before, SWEEP_PAGE, after)):
            after = (page[-1].updated_at, page[-1].run_id)
            for run in page:
                if run.run_id in seen:
                    continue
                seen.add(run.run_id)
                assessed = assess(rt, run, at, ready)
                if assessed is None or assessed[1].action == Action.WAIT:
                    continue
                quiet, plan = assessed
                reason, events = plan.reason, len(plan.events)
                if not dry_run:
                    try:
                        _act(rt, run, plan)
                    except Exception as exc:
                        if is_transient(exc):  # the database or the broker is away: every run alike, the next sweep
                            raise
                        # what is wrong is this run's alone: the pass goes on to the runs behind it
                        log.exception("could not re-drive a stalled run; the next sweep tries again",
                                      extra={"run_id": run.run_id, "action": plan.action})
                        reason, events = f"{reason}; not done ({type(exc).__name__}), the next sweep tries again", 0
                findings.append(Finding(run.run_id, run.agent, run.state.value, run.iteration, round(quiet, 1),
                                        plan.action, reason, events))
                if len(findings) >= limit:
                    break
        return findings


def _act(rt: Runtime, run: RunRecord, plan: Redrive) -> None:
    store = rt.store
    log.warning("re-driving a stalled run: %s", plan.reason,
                extra={"run_id": run.run_id, "action": plan.action, "state": run.state, "iteration": run.iteration})
    events: list[Envelope] = []
    with store.tx() as conn:
        current = store.get_run(run.run_id, conn, lock=True)
        if current is None or current.version != run.version:
            return  # it moved while we looked: not stalled after all
        store.note_redrive(conn, run.run_id)
        if plan.action == Action.REPUBLISH:
            events = [decode(e) for e in plan.events]
        elif plan.action == Action.RESUBMIT:
            goal = GoalSubmitted(agent=run.agent, goal_id=run.goal_id, input=run.input, limits=run.limits,
                                 progress=run.progress, thread_id=run.thread_id)
            events = [Envelope.new(EventType.GOAL_SUBMITTED, run.run_id, goal, trace_id=run.trace_id)]
        elif plan.action == Action.EXPIRE:
            result = result_of(current, status=ResultStatus.FAILED, error_code=ErrorCode.DEADLINE,
                               message=f"stalled past its deadline: {plan.reason}",
                               recovery_suggestion=RECOVERY_SUGGESTIONS[ErrorCode.DEADLINE])
            stored = result.model_dump(mode="json")
            if store.transition(conn, current, RunState.FAILED, result=stored, error_code=ErrorCode.DEADLINE):
                events = [ended_event(run.run_id, run.trace_id, result, thread_id=run.thread_id)]
                # Stored like any step's outbox, so a lost publish is found and sent by the next sweep.
                store.mark_processed(conn, f"sweep/{run.run_id}/expire", SWEEPER, stored_outbox(events),
                                     run_id=run.run_id)
    rt.publisher.publish(events, resent=plan.action == Action.REPUBLISH)  # a stored outbox's events, sent again
