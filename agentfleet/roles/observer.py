"""Observer: fans tool results in, and speaks to the outside world when a run ends.

Results of one iteration arrive in any order on any observer; the run row's
lock serialises them, so exactly one handling sees the set complete. When the only
calls still out are parked for a person (``approvals``) or answered by child runs
(``delegation``), the run waits; their answers fan in like any other result.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection

from agentfleet import constants as C
from agentfleet.errors import RECOVERY_SUGGESTIONS, ErrorCode
from agentfleet.events.contracts import DomainNotice, Result, ResultStatus, RunNotice, ToolHealthNotice
from agentfleet.events.domain import chain_bound, conflict, generation_of, started_by
from agentfleet.events.envelope import (
    DomainEvent,
    Envelope,
    EventType,
    GoalSubmitted,
    Observation,
    ObservationRecorded,
    RunCancelRequested,
    RunEnded,
    ToolFinished,
    ToolHealthChanged,
)
from agentfleet.loop.decisions import fan_in_complete
from agentfleet.loop.keys import derived_event_id, parent_of, run_id_for
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.loop.transcript import ToolResult
from agentfleet.roles import approvals, delegation, threads
from agentfleet.roles.step import Step, end_run, result_of
from agentfleet.store.base import RunMovedOn
from agentfleet.store.records import RunRecord
from agentfleet.store.sql import Later

log = logging.getLogger(__name__)


def on_tool_finished(step: Step) -> list[Envelope]:
    done = step.body()
    assert isinstance(done, ToolFinished)
    store = step.rt.store
    known = _known(step, done)
    if known is not None:
        try:
            return _fan_in_known(step, done, known)
        except RunMovedOn:
            log.info("run not as the call's result says: read", extra={"run_id": known.run_id})

    ahead: Later | None = None  # this transaction's: a transaction run again asks again

    def observe(conn: Connection) -> None:  # with the run's locked read: recorded only if the run fans in
        nonlocal ahead
        ahead = store.observe_while(conn, run_id=step.env.run_id, iteration=done.iteration,
                                    states=[str(s) for s in _FANNING_IN], call_id=done.call_id, tool=done.tool,
                                    result=done.result.model_dump(mode="json"))

    def fan_in(conn: Connection, run: RunRecord) -> list[Envelope]:
        noted = ahead.rows().first() if ahead is not None else None
        if noted is not None and noted[0]:
            first = bool(noted[1])
        else:  # SQLite; or the run came to fan in between the two statements (no call's result can, yet: kept)
            first = store.record_observation(conn, run_id=run.run_id, iteration=done.iteration,
                                             call_id=done.call_id, tool=done.tool,
                                             result=done.result.model_dump(mode="json"))
        if first and done.sibling_call_ids == [done.call_id]:  # the iteration's one call, first answered: no read
            observations = [Observation(call_id=done.call_id, tool=done.tool, result=done.result)]
        else:
            received = {o["call_id"]: o for o in store.observations(conn, run.run_id, done.iteration)}
            if not fan_in_complete(done.sibling_call_ids, received):
                approvals.wait_if_parked(step, conn, run, done.sibling_call_ids, received)
                delegation.wait_for_children(step, conn, run, done.sibling_call_ids, received)
                return step.commit(conn, [])
            observations = [
                Observation(call_id=cid, tool=received[cid]["tool"],
                            result=ToolResult.model_validate(received[cid]["result"]))
                for cid in done.sibling_call_ids
            ]
        return _observed(step, conn, run, done, observations)

    return step.locked_run(
        lambda run: run.state in _FANNING_IN and run.iteration == done.iteration, fan_in, first=observe,
        stale=lambda run: log.info("late tool result ignored", extra={"call_id": done.call_id,
                                                                      "state": run and run.state}))


_FANNING_IN = (RunState.EXECUTING, RunState.WAITING_APPROVAL, RunState.WAITING_CHILDREN)


def _known(step: Step, done: ToolFinished) -> RunRecord | None:
    """The run as the commit that sent the call out left it, when the call is its iteration's one and this process
    knows the rest of the row (``RunsLeft.finished``): its result then fans the iteration in, and the run moves on,
    in one round trip (the transaction's COMMIT) instead of two."""
    if done.run_left is None or done.sibling_call_ids != [done.call_id]:
        return None
    return step.rt.runs_left.finished(step.env.run_id, done.run_left)


def _fan_in_known(step: Step, done: ToolFinished, known: RunRecord) -> list[Envelope]:
    """``on_tool_finished`` for the one call of an iteration whose run is as ``known``: the run held as that, the
    result recorded as the call's first, the run moved on, all checked with the COMMIT, which fails the transaction
    whole when any of it is not so (``RunMovedOn``: the caller then reads as usual)."""
    store = step.rt.store
    with store.tx() as conn:
        run = store.hold_run(conn, known)  # Postgres: checked with the COMMIT; SQLite: read, and checked here
        if run is None or run.state != RunState.EXECUTING or run.iteration != done.iteration:
            raise RunMovedOn(f"run {known.run_id} is not as the call's result says")
        store.record_first_observation(conn, run_id=run.run_id, iteration=done.iteration, call_id=done.call_id,
                                       tool=done.tool, result=done.result.model_dump(mode="json"))
        return _observed(step, conn, run, done,
                         [Observation(call_id=done.call_id, tool=done.tool, result=done.result)])


def _observed(step: Step, conn: Connection, run: RunRecord, done: ToolFinished,
              observations: list[Observation]) -> list[Envelope]:
    """The iteration fanned in: the run moved to OBSERVING with its observations out to the planner, in ``conn``'s
    transaction; the run as moved is this process's to know once it commits (``RunsLeft``)."""
    store = step.rt.store
    moved = store.transition(conn, run, RunState.OBSERVING)
    if not moved:
        return step.commit(conn, [])
    store.after_commit(conn, lambda: step.rt.runs_left.keep(moved))
    event = step.event(
        EventType.OBSERVATION_RECORDED,
        ObservationRecorded(agent=run.agent, iteration=done.iteration, observations=observations,
                            planner=done.planner, observer=step.rt.tokens.get(C.OBSERVER)),
        key=(done.iteration, "observation"),
    )
    return step.commit(conn, [event])


def on_cancel_requested(step: Step) -> list[Envelope]:
    cancel = step.body()
    assert isinstance(cancel, RunCancelRequested)

    def cancel_it(conn: Connection, run: RunRecord) -> list[Envelope]:
        result = result_of(run, status=ResultStatus.CANCELLED, error_code=ErrorCode.CANCELLED, message=cancel.reason,
                           recovery_suggestion=RECOVERY_SUGGESTIONS[ErrorCode.CANCELLED])
        return end_run(step, conn, run, result)

    return step.locked_run(lambda run: not is_terminal(run.state), cancel_it)


def on_run_ended(step: Step) -> list[Envelope]:
    """Deliver the Result: to every reply_to that asked for it, and to the public exchange. The replies sent are
    marked so with the handling's commit, which also answers a parent, stops children and gives a thread's next run its
    turn; an end with none of these to do writes nothing."""
    ended = step.body()
    assert isinstance(ended, RunEnded)
    store, publisher = step.rt.store, step.rt.publisher
    result = Result.model_validate(ended.result)
    pending = store.pending_replies(step.env.run_id)
    for _id, reply_to, correlation_id in pending:
        publisher.reply(reply_to, correlation_id or None, result)
    if result.status != ResultStatus.SUCCEEDED:  # tools of a run that ended early may still run: stop them
        step.rt.stops.mark(step.env.run_id, f"{result.status}: {result.error_code}")
    if not ended.redelivery:  # with what an outside consumer needs to draw the tree (no query: ids say it)
        parent_run_id, parent_call_id = parent_of(result.goal_id) or (None, None)
        notice = RunNotice.model_validate({**ended.result, "type": str(step.env.type), "trace_id": step.env.trace_id,
                                           "parent_run_id": parent_run_id, "parent_call_id": parent_call_id,
                                           "lineage": ended.lineage})
        publisher.publish_public(notice.type, notice.model_dump(mode="json"), step.env.run_id)
    agent = step.rt.agent(result.agent or "")
    # Only a run of an agent that delegates can have children, and only a delegated run has a parent to answer (its
    # goal id says so): any other run's end costs no query here.
    may_have_children = agent is None or bool(agent.delegates)
    delegated = parent_of(result.goal_id) is not None
    stopped = stopped_early(result)
    related = not ended.redelivery and (may_have_children or delegated or stopped)
    thread_id = None if ended.redelivery else ended.thread_id  # its next run gets its turn
    if not pending and not related and thread_id is None:
        # Nothing to write, so no dedupe mark either: it would guard nothing (a second delivery publishes the notice
        # before it could find the mark, and finds no reply owed). One round trip, the replies owed read.
        return []
    with store.tx() as conn:
        store.mark_replied(conn, [p[0] for p in pending])
        events: list[Envelope] = []
        run = store.get_run(step.env.run_id, conn) if related else None
        if run is not None:  # a delegated run answers its parent's call; a run that ended stops its children
            why = f"{result.status} {result.error_code or ''}".strip()
            events = [*delegation.answer_parent(step, run, result),
                      *(delegation.cancel_children(step, conn, run, why) if may_have_children else []),
                      *(cancel_triggered(step, conn, run, why) if stopped else [])]
        if thread_id is not None:
            events += threads.next_turn(step, conn, thread_id)
        return step.commit(conn, events)


def on_tool_health_changed(step: Step) -> list[Envelope]:
    """Keep the transition and mirror it on the public exchange for dashboards and pagers."""
    change = step.body()
    assert isinstance(change, ToolHealthChanged)
    store, publisher = step.rt.store, step.rt.publisher
    notice = ToolHealthNotice(tool=change.tool, kind=change.kind, status=change.status, detail=change.detail,
                              time=change.at, by=change.by)
    publisher.publish_json(publisher.topology.public, notice.type, notice.model_dump(mode="json"),
                           declare=[publisher.topology.public])
    with store.tx() as conn:
        store.record_health_change(conn, event_id=step.env.event_id, tool=change.tool, kind=change.kind,
                                   status=change.status, detail=change.detail, by=change.by, occurred_at=change.at)
        return step.commit(conn, [])


def on_domain_event(step: Step) -> list[Envelope]:
    """Record a domain event once, mirror it on the public exchange, and start the runs its triggers name:
    one per (event id, agent), however often the event arrives. A trigger whose input breaks its agent's
    goal schema starts nothing: the goal is dead-lettered with INPUT_INVALID, never shown to a model."""
    event = step.body()
    assert isinstance(event, DomainEvent)
    store, publisher = step.rt.store, step.rt.publisher
    with store.tx() as conn:
        first = store.record_domain_event(
            conn, event_id=event.event_id, name=event.name, payload=event.payload, source=event.source,
            run_id=step.env.run_id if event.source == "run" else None, step_key=event.step_key,
            trace_id=step.env.trace_id)
        goals = triggered_goals(step, event, conn) if first else []
        if not first:
            clash = conflict(event.event_id, event.payload, store.domain_event(event.event_id, conn))
            if clash:  # never dropped silently: kept with the reason (the inbox answers most of these first)
                publisher.dead_letter_event(step.env, reason=clash, error_code=ErrorCode.EVENT_CONFLICT)
        events = step.commit(conn, goals)
    if first:  # after the commit; a redelivery before it mirrors again (at least once, like every notice)
        notice = DomainNotice(type=f"{C.DOMAIN_ROUTING_PREFIX}{event.name}", event_id=event.event_id,
                              payload=event.payload, source=event.source,
                              run_id=step.env.run_id if event.source == "run" else None, trace_id=step.env.trace_id)
        publisher.publish_json(publisher.topology.public, notice.type, notice.model_dump(mode="json"),
                               declare=[publisher.topology.public])
    return events


def triggered_goals(step: Step, event: DomainEvent, conn: Connection) -> list[Envelope]:
    """The goals of the runs an event's triggers start, each carrying its place in the causal chain (the trace,
    and its generation); none past the chain's bounds: those are dead-lettered TRIGGER_LOOP."""
    triggers = step.rt.agents.triggered_by(event.name)
    if not triggers:
        return []
    starts = started_by(triggers, event.event_id, event.payload)
    settings, store = step.rt.settings, step.rt.store
    generation = _generation_of_source(step, event, conn) + 1
    bound = chain_bound(generation, store.count_runs_in_trace(step.env.trace_id, conn),
                        sum(1 for s in starts if not s.problems), max_depth=settings.trigger_max_depth,
                        max_runs=settings.trace_max_runs)
    goals = []
    for start in starts:
        if bound is not None:
            step.rt.publisher.dead_letter(
                {"agent": start.agent, "goal_id": start.goal_id, "input": start.input},
                reason=f"trigger {event.name} → {start.agent} started nothing: {bound}",
                error_code=ErrorCode.TRIGGER_LOOP, source=f"trigger:{event.name}",
                original_routing_key=f"{C.GOAL_ROUTING_PREFIX}{start.agent}")
            continue
        if start.problems:
            step.rt.publisher.dead_letter(
                {"agent": start.agent, "goal_id": start.goal_id, "input": start.input},
                reason=f"trigger {event.name} → {start.agent}: input breaks its goal schema: "
                       f"{'; '.join(start.problems)}",
                error_code=ErrorCode.INPUT_INVALID, source=f"trigger:{event.name}",
                original_routing_key=f"{C.GOAL_ROUTING_PREFIX}{start.agent}")
            continue
        cause = {"event": event.name, "event_id": event.event_id, "source": event.source,
                 "run_id": step.env.run_id if event.source == "run" else None, "generation": generation}
        payload = GoalSubmitted(agent=start.agent, goal_id=start.goal_id, input=start.input, cause=cause)
        goals.append(Envelope.new(EventType.GOAL_SUBMITTED, run_id_for(start.agent, start.goal_id), payload,
                                  trace_id=step.env.trace_id, causation_id=step.env.event_id,
                                  event_id=derived_event_id(event.event_id, "trigger", start.agent)))
    return goals


def _generation_of_source(step: Step, event: DomainEvent, conn: Connection) -> int:
    """The generation of the run that published the event (a delegated run counts as its root's), or 0 for an
    event from outside."""
    if event.source != "run":
        return 0
    store = step.rt.store
    run = store.get_run(step.env.run_id, conn)
    if run is None:
        return 0
    if run.cause is None and run.ancestors:
        root = store.get_run(run.ancestors[0], conn)
        return generation_of(root.cause if root else None)
    return generation_of(run.cause)


def stopped_early(result: Result) -> bool:
    """A run cancelled or out of time was stopped, not finished: what it set going is stopped with it."""
    return result.status == ResultStatus.CANCELLED or result.error_code == ErrorCode.DEADLINE


def cancel_triggered(step: Step, conn: Connection, run: RunRecord, reason: str) -> list[Envelope]:
    """Cancel requests for the live runs this run's events triggered (they share its trace; a trace holds at most
    ``trace_max_runs``). Their own children and triggered runs follow as each ends."""
    why = f"the run {run.run_id} whose event started it was stopped: {reason}"
    return [Envelope.new(EventType.RUN_CANCEL_REQUESTED, other.run_id, RunCancelRequested(reason=why),
                         trace_id=run.trace_id, causation_id=step.env.event_id,
                         event_id=derived_event_id(other.run_id, "cause-stopped"))
            for other in step.rt.store.runs_in_trace(run.trace_id, step.rt.settings.trace_max_runs, conn)
            if (other.cause or {}).get("run_id") == run.run_id and not is_terminal(other.state)]

