"""Planner: creates runs from goals and, each iteration, asks the model what to do next.

The model's turn is checkpointed as the plan step's outcome, so a redelivered
event reuses it instead of calling the model again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import Connection

from agentfleet.agents.registry import Agent
from agentfleet.constants import FINAL_ANSWER_TOOL, PLANNER, REPAIR_MESSAGE_NAME
from agentfleet.context.assemble import Overflow
from agentfleet.context.builder import estimate_tokens
from agentfleet.context.counting import WRITTEN_CHARS_PER_TOKEN
from agentfleet.errors import RECOVERY_SUGGESTIONS, AgentNotLoaded, ErrorCode, GoalRejected, ModelError
from agentfleet.events.contracts import GraphStepNotice, Result, ResultStatus
from agentfleet.events.envelope import (
    Envelope,
    EventType,
    GoalSubmitted,
    Observation,
    ObservationRecorded,
    ToolRequested,
)
from agentfleet.fleet.gate import Offer
from agentfleet.hooks.base import Hooks, ModelCallInfo
from agentfleet.loop.budgets import (
    Limits,
    Reservation,
    Termination,
    TreeLevel,
    charged,
    check_gates,
    check_tree,
    check_turn,
)
from agentfleet.loop.decisions import (
    NO_PROGRESS_REPEATS,
    Dispatch,
    Fail,
    Finish,
    Repair,
    decide,
    plan_signatures,
    schema_errors,
    usable_turn,
)
from agentfleet.loop.keys import idempotency_key
from agentfleet.loop.recovery import model_first
from agentfleet.loop.states import RunState, is_terminal
from agentfleet.loop.transcript import History, Message, ModelTurn, Usage
from agentfleet.models.base import ModelRequest, estimated_usage
from agentfleet.models.retrying import RetryPolicy, with_retries
from agentfleet.roles import delegation, step_notices
from agentfleet.roles.admission import check_conflict
from agentfleet.roles.prompt import prompt_for, recorded_summary
from agentfleet.roles.retry import CommitPending, InFlight, outcome_at_risk
from agentfleet.roles.runs_left import left_by
from agentfleet.roles.step import Step, end_run, result_of
from agentfleet.store.base import RunMovedOn, StepHold
from agentfleet.store.records import RunRecord, StepRecord, now
from agentfleet.store.repository import Store
from agentfleet.store.sql import POSTGRES

log = logging.getLogger(__name__)
RESERVED, RELEASED = "reserved", "released"  # a delegated plan step's hold on its ancestors' budgets, in its input


def on_goal_submitted(step: Step) -> list[Envelope]:
    goal = step.body()
    assert isinstance(goal, GoalSubmitted)
    store = step.rt.store
    agent = step.rt.agent(goal.agent)
    if agent is None or schema_errors(agent.goal_schema, goal.input):
        # Admission validates before publishing; reaching here means workers disagree on agents.
        raise AgentNotLoaded(f"goal for {goal.agent!r} reached a planner that does not load it (or admits its "
                             "input differently)")
    limits = agent.limits.tightened_by(goal.limits)
    started_here: RunRecord | None = None  # the run as this handling's COMMIT leaves it, when it starts it
    with store.tx() as conn:
        run = store.start_run(
            conn, run_id=step.env.run_id, agent=goal.agent, goal_id=goal.goal_id, trace_id=step.env.trace_id,
            input=goal.input, limits=limits.model_dump(),
            parent=goal.parent.model_dump(mode="json") if goal.parent else None, cause=goal.cause,
            progress=goal.progress, thread_id=goal.thread_id, lineage=goal.lineage,
        )
        try:  # the one check for every goal from the inbox: this reads the run anyway
            check_conflict(goal.goal_id, goal.input, run)
        except GoalRejected as exc:
            _refuse_copy(step, goal, exc)
            return step.commit(conn, [])
        if goal.reply_to:
            store.add_reply(conn, step.env.run_id, goal.reply_to, goal.correlation_id)
        start = run.iteration if run.lineage else 0  # a retried or forked run starts where its source left off
        if run.state != RunState.PENDING and (run.state != RunState.PLANNING or run.iteration != start):
            # A second copy of a goal already under way (or done): one run, and this copy's
            # reply_to gets that run's Result when there is one.
            events = []
            if is_terminal(run.state) and goal.reply_to and run.result:
                events = [step.run_ended(run.run_id, Result.model_validate(run.result), redelivery=True)]
            return step.commit(conn, events)
        if run.state == RunState.PENDING:
            started = {}
            if run.thread_id is not None:  # one run of a thread at a time: this one waits for those before it
                run = store.place_on_thread(conn, run)
                turn = store.thread_turn(conn, run.thread_id)
                if turn is not None and turn.run_id != run.run_id:
                    log.info("waiting for its thread's turn", extra={"thread_id": run.thread_id,
                                                                     "behind": turn.run_id})
                    return step.commit(conn, [])  # pending: the end of the run before it gives it its turn
                started = {"started_at": now()}  # its deadline counts from its turn, not from its wait
            started_here = store.transition(conn, run, RunState.PLANNING, **started)  # we hold the row lock
            # The handling goes on to plan: the goal's message is acked only after the plan's COMMIT, which waits for
            # the disk and takes this one with it (one WAL). A crash of the database before then loses a start that
            # the goal, delivered again, makes again.
            store.relax(conn)
    carried = [Message.model_validate(m) for m in goal.carried] if run.lineage else []
    # Started here, the run is known as this COMMIT left it: the first plan holds it as that instead of reading it.
    return _plan(step, agent, start, carried, lambda conn, run: run if _planning(start)(run) else None,
                 known=started_here)


def _refuse_copy(step: Step, goal: GoalSubmitted, exc: GoalRejected) -> None:
    """Answer this copy of a goal (not the run its goal_id names) and keep it with the reason."""
    publisher = step.rt.publisher
    if goal.reply_to:
        publisher.reply(goal.reply_to, goal.correlation_id,
                        Result.rejection(exc.code, exc.message, agent=goal.agent, goal_id=goal.goal_id))
    publisher.dead_letter_event(step.env, reason=exc.message, error_code=exc.code)


def on_observation_recorded(step: Step) -> list[Envelope]:
    obs = step.body()
    assert isinstance(obs, ObservationRecorded)
    agent = step.rt.agent(obs.agent)
    if agent is None:
        raise AgentNotLoaded(f"agent {obs.agent!r} is not loaded by this planner")
    nxt = obs.iteration + 1
    store = step.rt.store

    def arrive(conn: Connection, run: RunRecord) -> RunRecord | None:
        """The run moved on to plan the next iteration (by this handling or an earlier one), or None: stale."""
        if run.state == RunState.OBSERVING and run.iteration == obs.iteration:
            run = store.transition(conn, run, RunState.PLANNING, iteration=nxt) or run  # we hold the row lock
        if not (run.state == RunState.PLANNING and run.iteration == nxt):
            log.info("stale observation ignored", extra={"state": run.state, "iteration": run.iteration})
            return None
        return run

    tool_messages = [
        Message(role="tool", tool_call_id=o.call_id, name=o.tool, content=o.result.for_model_json())
        for o in obs.observations
    ]
    if obs.repair is not None:
        tool_messages.append(Message(role="user", name=REPAIR_MESSAGE_NAME, content=obs.repair))
    return _plan(step, agent, nxt, tool_messages, arrive,
                 known=step.rt.runs_left.observed(step.env.run_id, obs.iteration))


def _plan(step: Step, agent: Agent, iteration: int, new_messages: list[Message],
          arrive: Callable[[Connection, RunRecord], RunRecord | None], *,
          known: RunRecord | None = None) -> list[Envelope]:
    """One iteration: gates, the model call (or its checkpoint), the decision, committed with its events.

    Two transactions around the model call. The first holds the run's row: ``arrive`` moves the run to this
    iteration (or finds it stale), the gates are checked, the plan step's intent is recorded and the transcript
    read, in the round trip of its COMMIT, which does not wait for the disk (a crash of the database before the
    second commits costs one model call: the event is redelivered). The second records the turn and the decision
    (``_decide_and_commit``), holding the run as the first left it (``Step.locked_run``'s ``known``).

    ``known``: the run as this process's planner last left it: moved on as the event says (``RunsLeft``), or, for a
    run's first plan, as the COMMIT that started it left it. The first transaction then holds the row as that, and
    takes the step's lock, in the round trip of its COMMIT instead of reading the row first; a row not as known, or a
    step held elsewhere, fails it whole, and it runs again on the row read.

    With the run known and its transcript too (this process's planner committed both), on a first delivery, for a
    model that says its call is short (``loop/recovery.model_first``), the plan is made first: the model is asked
    before anything is written, and one transaction holds the run as known, moves it on, and commits the plan step
    (finished), the turn and the decision (``_plan_first``): one round trip. A run that moved on meanwhile fails that
    transaction whole, and the turn is committed the usual way, carried; a first try that failed and may be retried
    is followed by the rest of the tries the usual way.
    """
    store = step.rt.store
    run_id = step.env.run_id
    key = idempotency_key(run_id, iteration, "plan")
    failed: Exception | None = None  # the first try at the model, made first, when it may be tried again
    if known is not None and (history := _known_history(step, agent, known, iteration)) is not None:
        first = _plan_first(step, agent, iteration, new_messages, known, history)
        if isinstance(first, list):
            return first
        if first.failed is None:  # a commit found the run moved on: it is read, and a turn made is committed on it
            step.carried, known = first.carried, None
        failed = first.failed
    with store.step_lock(key) as held:
        # Asked before the run's row is held: a Redis that answers slowly must not keep a cancel waiting.
        offer = step.rt.dispatch.offer(list(agent.tools.values()), _unconsumed(step, agent))

        def begin(taken: RunRecord | None) -> list[Envelope] | tuple[RunRecord, Callable[[], StepRecord],
                                                                       Callable[[], History], int | None]:
            """The first transaction: what ended the handling, or the run, the intent's record, the history and the
            version of the observer's move this handling moved the run on from (None if it did not)."""
            with store.tx() as conn:
                if taken is not None and store.hold_and_lock(conn, taken, held):
                    found: RunRecord | None = taken  # held with the lock, with the COMMIT, or none of this stays
                else:
                    found = store.get_run(run_id, conn, lock=True)  # the step lock is asked in the same round trip
                    if not held:  # nothing written yet: the transaction is dropped
                        raise InFlight(f"plan step {key} is being planned elsewhere")
                run = arrive(conn, found) if found is not None else None
                if run is None:
                    return step.commit(conn, [])
                assert found is not None
                moved_from = (found.version if found.state == RunState.OBSERVING and run.version == found.version + 1
                              else None)
                gate = (check_gates(Limits.model_validate(run.limits), run.usage, iteration, run.elapsed_s(),
                                    run.steps_used)
                        or _tree_gate(store, run, conn)
                        or (_cause_gate(store, run, conn) if iteration == 0 else None))
                if gate is not None:
                    status = ResultStatus.CANCELLED if gate.code == ErrorCode.CANCELLED else ResultStatus.FAILED
                    return _end_in(step, conn, run, run, new_messages, iteration, None, status, gate.code,
                                   gate.message)
                # A redelivered plan the first attempt at which may have asked its model first, writing nothing, and
                # died: counted as one (2 if the intent is new), so a plan that crashes every worker is stopped after
                # the same number of crashes as any other.
                first_may_have = step.redelivered and iteration > 0 and _may_go_first(step, agent, run)
                intent = store.intend_step(conn, key=key, run_id=run_id, iteration=iteration, kind="plan",
                                           worker=step.worker, input={"tools": offer.tools, "notice": offer.notice},
                                           attempts=2 if first_may_have else 1)
                read_history = store.history_later(run_id, conn)  # the intent, this read and the COMMIT: one trip
                # Not durable: a model turn lost with the intent in a database crash is asked for again, as a first
                # try.
                store.relax(conn)
            return run, intent, read_history, moved_from

        try:
            begun = begin(known)
        except RunMovedOn:
            if known is None:
                raise
            log.info("run not as this planner left it: read", extra={"run_id": run_id})
            if isinstance(held, StepHold):
                held.ask_again()
            begun = begin(None)
        if not held:  # answered already (taken, with the row held as known): asked now, so that the handling's last
            raise InFlight(f"plan step {key} is being planned elsewhere")  # COMMIT lets go of it (``release_held``)
        if isinstance(begun, list):
            return begun
        run, intent, read_history, moved_from = begun
        limits = Limits.model_validate(run.limits)
        record = intent()
        if record.status != "started":  # planned by an earlier handling that already committed its events
            with store.tx() as conn:
                return step.commit(conn, [])
        if step.carried is None and record.attempts > step.rt.settings.max_step_attempts:
            msg = f"planning iteration {iteration} crashed its worker {record.attempts - 1} times"
            return _end(step, run, new_messages, iteration, None, ResultStatus.FAILED, ErrorCode.POISON_MESSAGE, msg)
        history = read_history()
        if run.lineage:  # retried or forked: the source's transcript first, read from it
            history = store.lineage_history(run.lineage).plus(history.messages)
        summary = None  # the model-written summary the last turn recorded, to go on from
        if agent.summary_model is not None and iteration > 0:
            with store.reading() as conn:
                summary = recorded_summary(store.step_output(conn, idempotency_key(run_id, iteration - 1, "plan")))
        seen = history.plus(new_messages)  # what the model is shown: all it has seen, and what came back
        if step.carried is not None:  # the model answered before a database outage: commit that answer
            context = step.carried.get("context")
            planned = Planned(ModelTurn.model_validate(step.carried["turn"]), float(step.carried["duration_ms"]),
                              context if isinstance(context, dict) else None)
        else:
            thread = store.thread_before(run) if run.thread_id else []
            prompt = prompt_for(agent, run, limits, iteration, seen, _checkpointed_offer(record.input, offer), summary,
                                thread)
            if isinstance(prompt, Overflow):
                return _end(step, run, new_messages, iteration, None, ResultStatus.FAILED,
                            ErrorCode.CONTEXT_BUDGET_EXCEEDED, prompt.message)
            request = ModelRequest(run_id=run.run_id, agent=agent.name, iteration=iteration, goal=run.input,
                                   tools=prompt.tools, messages=prompt.messages)
            if run.ancestors:  # held in every ancestor before the call: concurrent siblings see each other's
                reserved = _reserve(step, agent, run, key, request)
                if isinstance(reserved, Termination):
                    status = ResultStatus.CANCELLED if reserved.code == ErrorCode.CANCELLED else ResultStatus.FAILED
                    return _end(step, run, new_messages, iteration, None, status, reserved.code, reserved.message)
            started = time.perf_counter()
            try:
                turn = _complete(step.rt.hooks, agent, request, step.rt.settings.model_retry_policy, failed)
            except Exception as exc:
                return _model_failed(step, agent, run, new_messages, iteration, exc)
            planned = _planned(turn, started, prompt.spent, prompt.report)
        return _commit_plan(step, agent, run, new_messages, iteration, planned, seen, moved_from)


def _model_failed(step: Step, agent: Agent, run: RunRecord, new_messages: list[Message], iteration: int,
                  exc: Exception, arrival: _Arrival | None = None) -> list[Envelope]:
    """End the run with the model's failure. The Result carries a line; the operator gets the traceback with the run
    and trace ids, but for a ModelError: a failure the adapter (or a graph) has sorted and said in a line already."""
    log.error("model call failed: %s", exc, exc_info=None if isinstance(exc, ModelError) else exc,
              extra={"model": agent.model.name, "iteration": iteration})
    code = exc.code if isinstance(exc, ModelError) else ErrorCode.MODEL_ERROR
    return _end(step, run, new_messages, iteration, None, ResultStatus.FAILED, code, f"{agent.model.name}: {exc}",
                arrival=arrival)


def _planned(turn: ModelTurn, started: float, spent: Usage, report: dict[str, object] | None) -> Planned:
    if spent != Usage():  # writing the summary counts with the turn it was written for
        turn = turn.model_copy(update={"usage": turn.usage + spent})
    return Planned(turn, round((time.perf_counter() - started) * 1000, 3), report)


def _commit_plan(step: Step, agent: Agent, run: RunRecord, new_messages: list[Message], iteration: int,
                 planned: Planned, seen: History, moved_from: int | None,
                 arrival: _Arrival | None = None) -> list[Envelope]:
    """The decision on a turn committed, and said; an outcome at risk in a database outage is carried to the retry."""
    try:
        events = _decide_and_commit(step, agent, run, new_messages, iteration, planned, seen, moved_from, arrival)
    except Exception as exc:
        if outcome_at_risk(exc):
            raise CommitPending(_carried(planned), exc) from exc
        raise
    step_notices.planned(step, run, iteration, planned.turn, planned.duration_ms)
    if getattr(agent.model, "whole_transcript", False):
        _graph_step_notice(step, run, planned.turn)
    return events


def _carried(planned: Planned) -> dict[str, object]:
    """A turn as a later attempt at the handling takes it up (``Step.carried``) instead of asking for it again."""
    return {"turn": planned.turn.model_dump(mode="json"), "duration_ms": planned.duration_ms,
            "context": planned.context}


@dataclasses.dataclass(frozen=True)
class _Arrival:
    """A plan made before anything of its iteration was written (``model_first``): its commit also holds the run as
    ``known`` (OBSERVING, as this process's planner left it, moved on by the observer), moves it on to the iteration,
    and writes the plan step whole; ``began``: the model was asked (the step has an outcome to record)."""

    known: RunRecord
    input: dict[str, object]
    started_at: datetime
    began: bool = True


@dataclasses.dataclass(frozen=True)
class _Fallback:
    """The plan goes on the usual way, in two transactions: with the turn the model gave (``carried``: the run moved
    on during the call, and is read), or after the first try, which failed and may be tried again (``failed``)."""

    carried: dict[str, object] | None = None
    failed: Exception | None = None


def _known_history(step: Step, agent: Agent, known: RunRecord, iteration: int) -> History | None:
    """The transcript the model is shown, known in this process, when the planner may ask the model first."""
    first = step.first_delivery and step.carried is None
    history = (step.rt.store.planned_history(known.run_id, iteration - 1, (known.version, known.version - 1))
               if first else None)
    return history if _may_go_first(step, agent, known, first=first, transcript_known=history is not None) else None


def _may_go_first(step: Step, agent: Agent, run: RunRecord, *, first: bool = True,
                  transcript_known: bool = True) -> bool:
    """``model_first`` for a plan of ``run`` (known) by this handling: ``first``, a first delivery with no turn carried.
    With the defaults, whether a first attempt at it may have been made first: one that was redelivered may have
    written nothing and taken its worker down, and counts so."""
    plain = not (run.ancestors or run.thread_id or run.lineage or agent.summary_model is not None)
    return step.rt.store.dialect == POSTGRES and model_first(
        first_delivery=first, carried=False, run_known=True, transcript_known=transcript_known, plain=plain,
        longest_call_s=getattr(agent.model, "longest_call_s", None), stall_after_s=step.rt.settings.stall_after_s)


def _plan_first(step: Step, agent: Agent, iteration: int, new_messages: list[Message], known: RunRecord,
                history: History) -> list[Envelope] | _Fallback:
    """One iteration in one transaction: the gates on the run as known, the model's one try, then the run held as
    known, moved on to the iteration, and the plan step, the turn and the decision committed together. The run as it
    will be once moved on (``run``) is what the gates, the prompt and the decision see; the commit's move makes it so
    or fails the transaction whole (``RunMovedOn``: the turn goes on, carried, the usual way)."""
    run = known.replace(state=RunState.PLANNING, iteration=iteration, version=known.version + 1)
    limits = Limits.model_validate(run.limits)
    started_at = now()
    gate = check_gates(limits, run.usage, iteration, run.elapsed_s(), run.steps_used)
    try:
        if gate is not None:  # ended before a step began, as the usual way's first transaction ends it
            status = ResultStatus.CANCELLED if gate.code == ErrorCode.CANCELLED else ResultStatus.FAILED
            return _end(step, run, new_messages, iteration, None, status, gate.code, gate.message,
                        arrival=_Arrival(known, {}, started_at, began=False))
        offer = step.rt.dispatch.offer(list(agent.tools.values()), _unconsumed(step, agent))
        arrival = _Arrival(known, {"tools": offer.tools, "notice": offer.notice}, started_at)
        seen = history.plus(new_messages)
        prompt = prompt_for(agent, run, limits, iteration, seen, offer, None, [])
        if isinstance(prompt, Overflow):
            return _end(step, run, new_messages, iteration, None, ResultStatus.FAILED,
                        ErrorCode.CONTEXT_BUDGET_EXCEEDED, prompt.message, arrival=arrival)
        request = ModelRequest(run_id=run.run_id, agent=agent.name, iteration=iteration, goal=run.input,
                               tools=prompt.tools, messages=prompt.messages)
        started = time.perf_counter()
        try:
            turn = _complete(step.rt.hooks, agent, request, dataclasses.replace(step.rt.settings.model_retry_policy,
                                                                                  attempts=1))
        except Exception as exc:
            if step.rt.settings.model_retry_policy.retries(1, exc):
                return _Fallback(failed=exc)
            return _model_failed(step, agent, run, new_messages, iteration, exc, arrival)
        planned = _planned(turn, started, prompt.spent, prompt.report)
    except RunMovedOn:  # before a turn: the usual way, from the start
        log.info("run not as this planner left it: read", extra={"run_id": run.run_id})
        return _Fallback()
    try:
        return _commit_plan(step, agent, run, new_messages, iteration, planned, seen, known.version, arrival)
    except RunMovedOn:
        log.info("run not as this planner left it: read, and the turn committed on it", extra={"run_id": run.run_id})
        return _Fallback(carried=_carried(planned))


def _graph_step_notice(step: Step, run: RunRecord, turn: ModelTurn) -> None:
    """``graph.step`` on the public exchange, once the step's plan is committed, from the record the graph's turn
    carries (graphs/binding.py). At most once a step: a redelivered plan step finds its work done and says
    nothing again; a graph's trace holds every step either way."""
    try:
        said = json.loads(turn.text or "")
        record = (said.get("path") or [{}])[-1]
        notice = GraphStepNotice(run_id=run.run_id, trace_id=run.trace_id, graph=str(said.get("graph")),
                                 step=int(said.get("step")),
                                 nodes=[c.id.split(".", 3)[-1] for c in turn.tool_calls if c.name != FINAL_ANSWER_TOOL],
                                 edges=record.get("edges") or [], failed=record.get("failed") or [])
    except (ValueError, TypeError, AttributeError, ValidationError):
        return  # not a graph's record: nothing to say
    step.rt.publisher.publish_public(notice.type, notice.model_dump(mode="json"), run.run_id)


def _reserve(step: Step, agent: Agent, run: RunRecord, key: str, request: ModelRequest) -> Reservation | Termination:
    """Hold this turn's estimate in every ancestor, checking the tree with what is spent and what the turns in
    flight beneath each ancestor hold (rows locked in id order: one order for every planner, no deadlock). A
    retried plan step keeps the reservation its first attempt made."""
    store = step.rt.store
    with store.tx() as conn:
        recorded = store.step_input(conn, key, lock=True)
        recorded = recorded if isinstance(recorded, dict) else {}
        earlier = Reservation.from_dict(recorded.get(RESERVED))
        if earlier is not None:
            return earlier
        ancestors = store.get_runs(run.ancestors, conn, lock=True)
        gate = check_tree([_level(a) for a in ancestors])
        if gate is not None:
            return gate
        estimate = estimated_usage(agent.model, request, estimate_tokens(request.messages),
                                   step.rt.settings.model_prices)
        held = Reservation(estimate.total_tokens, estimate.cost_usd, 1)
        store.reserve(conn, run.ancestors, held)
        store.set_step_input(conn, key, {**recorded, RESERVED: held.as_dict()})
        return held


def _released(store: Store, conn: Connection, key: str) -> Reservation | None:
    """The reservation a plan step holds, given back once (marked so in the step, in the same transaction)."""
    recorded = store.step_input(conn, key, lock=True)
    if not isinstance(recorded, dict) or recorded.get(RELEASED):
        return None
    held = Reservation.from_dict(recorded.get(RESERVED))
    if held is not None:
        store.set_step_input(conn, key, {**recorded, RELEASED: True})
    return held


def _level(a: RunRecord) -> TreeLevel:
    return TreeLevel(f"run {a.run_id} ({a.agent})", Limits.model_validate(a.limits), a.usage, a.steps_used,
                     a.elapsed_s(), str(a.state) if is_terminal(a.state) else None,
                     Reservation(a.reserved_tokens, a.reserved_cost_usd, a.reserved_steps))


def _cause_gate(store: Store, run: RunRecord, conn: Connection) -> Termination | None:
    """A triggered run whose goal was still queued when the run whose event started it was stopped (cancelled,
    out of time) does not start: the stop cascades to the triggered runs that exist, and this catches the rest."""
    source = (run.cause or {}).get("run_id")
    if not isinstance(source, str):
        return None
    cause = store.get_run(source, conn)
    if cause is None or not (cause.state == RunState.CANCELLED or cause.error_code == ErrorCode.DEADLINE):
        return None
    what = f"{cause.state} {cause.error_code or ''}".strip()
    return Termination(ErrorCode.CANCELLED, f"the run {source} whose event started it was stopped ({what})")


def _tree_gate(store: Store, run: RunRecord, conn: Connection) -> Termination | None:
    """A delegated run also stops when an ancestor has ended (its cancel cannot reach a child whose goal was
    still queued, with no run to cancel yet: the child sees it here, before its first turn and every other),
    or when an ancestor's subtree has spent that ancestor's limits. One query."""
    if not run.ancestors:
        return None
    return check_tree([_level(a) for a in store.get_runs(run.ancestors, conn)])


def _checkpointed_offer(recorded: object, current: Offer) -> Offer:
    """The tools this iteration's first attempt offered: a re-run shows the model what it was shown."""
    if isinstance(recorded, dict) and isinstance(recorded.get("tools"), list):
        return Offer([str(t) for t in recorded["tools"]], recorded.get("notice"))
    return current


def _decide_and_commit(step: Step, agent: Agent, run: RunRecord, new_messages: list[Message], iteration: int,
                       planned: Planned, seen: History, moved_from: int | None = None,
                       arrival: _Arrival | None = None) -> list[Envelope]:
    """``seen``: the transcript and this iteration's results, as the model was shown them; ``moved_from``: the
    version of the observer's move the run (``run``) was moved on from by this handling; ``arrival``: the commit also
    moves the run on to the iteration (``_plan_first``)."""
    limits = Limits.model_validate(run.limits)
    planned = dataclasses.replace(planned, turn=usable_turn(planned.turn))  # what the store can hold, as decided
    # A graph's loops are its author's (a poll, a check and fix) and end by its conditions or its max_steps; the
    # repeated-call check is for a model stuck in a rut.
    repeats = [] if getattr(agent.model, "whole_transcript", False) else plan_signatures(seen.messages,
                                                                                        NO_PROGRESS_REPEATS - 1)
    decision = decide(planned.turn, agent.result_schema, repeats,
                      tools=agent.callable(),
                      repairs_left=limits.max_repairs - seen.repairs, max_calls=limits.max_calls_per_turn)
    if isinstance(decision, Dispatch):
        # What the model wrote (names, arguments, text), at the context builder's rate: not the message's framing,
        # which an honest model's count of its output does not include.
        written = sum(len(c.name) + len(json.dumps(c.arguments, default=str)) for c in decision.calls)
        written += len(planned.turn.text or "")
        over = check_turn(limits, run.usage + charged(planned.turn.usage, written // WRITTEN_CHARS_PER_TOKEN))
        if over is not None:
            return _end(step, run, new_messages, iteration, planned, ResultStatus.FAILED, over.code, over.message,
                        arrival=arrival)
    if isinstance(decision, Repair):
        return _repair(step, run, new_messages, iteration, planned, decision, seen, arrival)
    if isinstance(decision, Finish):
        return _end(step, run, new_messages, iteration, planned, ResultStatus.SUCCEEDED, output=decision.output,
                    arrival=arrival)
    if isinstance(decision, Fail):
        message = decision.message + (": " + "; ".join(decision.details) if decision.details else "")
        return _end(step, run, new_messages, iteration, planned, ResultStatus.FAILED, decision.code, message,
                    arrival=arrival)
    return _dispatch(step, run, new_messages, iteration, planned, decision, seen, moved_from, arrival)


@dataclasses.dataclass(frozen=True)
class Planned:
    """A model turn and how long the model took to give it."""

    turn: ModelTurn
    duration_ms: float
    context: dict[str, object] | None = None  # what the prompt took, by part, and what was compacted


def _complete(hooks: Hooks, agent: Agent, request: ModelRequest, policy: RetryPolicy,
              failed: Exception | None = None) -> ModelTurn:
    """The model's turn, each try through the hooks, retried as models/retrying.py decides per error (``failed``: the
    first try's error, when it was made before anything was written)."""
    call = ModelCallInfo(run_id=request.run_id, agent=agent.name, model=agent.model.name, iteration=request.iteration)

    def once() -> ModelTurn:
        with hooks.model_call(call) as got:
            got.append(agent.model.complete(request))
        return got[0]

    return with_retries(once, policy, failed=failed)


def _usage_fields(run: RunRecord, turn: ModelTurn | None) -> dict[str, object]:
    usage = run.usage + turn.usage if turn else run.usage
    return dict(steps_used=run.steps_used + (1 if turn else 0), input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens, cost_usd=usage.cost_usd,
                cached_input_tokens=usage.cached_input_tokens, unpriced=usage.unpriced)


def _checkpoint(step: Step, conn: Connection, run: RunRecord, iteration: int, new_messages: list[Message],
                planned: Planned | None, repair: str | None = None, arrival: _Arrival | None = None) -> Message | None:
    """Store the observations that led here, the model's turn and the plan step's outcome; a delegated run's
    turn is counted in its ancestors' spend in the same transaction (once, however often it is retried). The turn
    as stored, if any."""
    store = step.rt.store
    # The results that led here (positions 1… of the last iteration) and this turn (position 0), in one insert.
    slots = [(iteration - 1, i, m) for i, m in enumerate(new_messages, start=1)]
    turn = planned.turn.as_message() if planned is not None else None
    if turn is not None:
        slots.append((iteration, 0, turn))
    store.write_messages(conn, run.run_id, slots)
    if run.ancestors:  # what the turn spent counts in every ancestor, and what it held there is given back
        held = _released(store, conn, idempotency_key(run.run_id, iteration, "plan"))
        if planned is not None or held is not None:
            store.add_spend(conn, run.ancestors, planned.turn.usage if planned else None, release=held)
    if planned is not None:
        summary = _plan_summary(planned.turn)
        if planned.context:  # a graph's turn has none
            summary["context"] = planned.context
        _finish_plan(step, conn, run, iteration, arrival, status="succeeded",
                     output={**summary, "repair": repair} if repair else summary, duration_ms=planned.duration_ms)
    return turn


def _finish_plan(step: Step, conn: Connection, run: RunRecord, iteration: int, arrival: _Arrival | None, *,
                 status: str, output: dict[str, object], duration_ms: float) -> None:
    """The plan step's outcome: its intent finished, or (a plan made first) the step written whole, begun and
    finished; one that ended before the model was asked has no step, as when its intent was never written."""
    key = idempotency_key(run.run_id, iteration, "plan")
    if arrival is None:
        step.rt.store.finish_step(conn, key, status=status, output=output, duration_ms=duration_ms)
    elif arrival.began:
        step.rt.store.record_step(conn, key=key, run_id=run.run_id, iteration=iteration, kind="plan", call_id="",
                                  name="", input=arrival.input, worker=step.worker, status=status, output=output,
                                  started_at=arrival.started_at, duration_ms=duration_ms)


def _locked(step: Step, fresh: Callable[[RunRecord], bool], then: Callable[[Connection, RunRecord], list[Envelope]],
            run: RunRecord, arrival: _Arrival | None) -> list[Envelope]:
    """``then`` in a transaction holding the run: as ``Step.locked_run`` holds it (``run``, as the first transaction
    left it), or, for a plan made first, held as known and moved on to the iteration in this same transaction, which
    fails whole (``RunMovedOn``, raised) when the run is not as known."""
    if arrival is None:
        return step.locked_run(fresh, then, known=run)
    store = step.rt.store
    with store.tx() as conn:
        held = store.hold_run(conn, arrival.known)
        moved = store.transition(conn, held, RunState.PLANNING, iteration=run.iteration) if held else None
        assert moved is not None, "held at its version on Postgres: the move is sent, and cannot miss"
        return then(conn, moved)


def _plan_summary(turn: ModelTurn) -> dict[str, object]:
    """The plan step's outcome. The turn itself lives once, in the transcript (storage stays ~1× it)."""
    return {"calls": [c.name for c in turn.tool_calls], "model": turn.model,
            "usage": turn.usage.model_dump()}


def _unconsumed(step: Step, agent: Agent) -> dict[str, str]:
    """The agent's tools whose dedicated queue no executor consumes now, with why (the model is told)."""
    queues = {t.queue for t in agent.tools.values() if t.queue}
    if not queues:
        return {}
    idle = step.rt.publisher.idle_tool_queues(queues)
    return {t.name: f"no executor consumes its queue {t.queue!r}" for t in agent.tools.values() if t.queue in idle}


def _queue_of(step: Step, agent: Agent | None, name: str) -> str | None:
    """Where a call goes: its tool's dedicated queue while an executor consumes it; else (None) the executors'
    own queue, which answers it TOOL_UNAVAILABLE at once instead of leaving it where nothing takes it."""
    tool = agent.tool(name) if agent is not None else None
    if tool is None or tool.queue is None:
        return None
    return None if tool.queue in step.rt.publisher.idle_tool_queues([tool.queue]) else tool.queue


def _dispatch(step: Step, run: RunRecord, new_messages: list[Message], iteration: int, planned: Planned,
              decision: Dispatch, seen: History, moved_from: int | None = None,
              arrival: _Arrival | None = None) -> list[Envelope]:
    store = step.rt.store
    agent = step.rt.agent(run.agent)
    call_ids = [c.id for c in decision.calls]
    handed = [c for c in decision.calls if agent is not None and delegation.planner_hands_off(step, agent, c)]
    queues = {c.id: _queue_of(step, agent, c.name) for c in decision.calls if c not in handed}  # not with the row held
    answered = step.body()  # the observer that sent the observation this plan answers holds the run as its move left it
    observer = answered.observer if isinstance(answered, ObservationRecorded) else None

    def requested(moved: RunRecord) -> list[Envelope]:
        """The calls for executors. The iteration's one call carries the run as this commit leaves it, for the
        observer to hold without reading (``RunsLeft.finished``), and whether the observer's move this handling moved
        it on from is all the row's history since: it is when the run held now is the one the first transaction
        left, moved on from that move."""
        vouched = moved_from if moved.version == run.version + 1 else None  # ``begin`` left ``run`` at moved_from + 1
        left = left_by(moved, vouched) if len(call_ids) == 1 else None
        return [
            step.event(
                EventType.TOOL_REQUESTED,
                ToolRequested(agent=run.agent, iteration=iteration, call=call, sibling_call_ids=call_ids,
                              idempotency_key=idempotency_key(run.run_id, iteration, "tool", call.id),
                              deadline_at=run.deadline_at().timestamp(), queue=queues[call.id], progress=run.progress,
                              run_left=left, planner=step.rt.tokens.get(PLANNER), observer=observer),
                key=(iteration, call.id),
            )
            for call in decision.calls if call not in handed
        ]

    def execute(conn: Connection, current: RunRecord) -> list[Envelope]:
        turn = _checkpoint(step, conn, run, iteration, new_messages, planned, arrival=arrival)
        moved = store.transition(conn, current, RunState.EXECUTING, **_usage_fields(current, planned.turn))
        if not moved:
            return step.commit(conn, [])
        _left(step, conn, moved, seen, turn)  # the run the observer moves on from: the next plan knows it
        out, started = requested(moved), 0
        for call in handed:  # children start from here: no executor hop, never queued behind slow tools
            assert agent is not None
            more, child = delegation.hand_off_from_planner(step, conn, moved, agent, iteration, call, call_ids)
            out += more
            started += child
        if handed and started == len(call_ids):  # every call went to a child: nothing runs in a worker
            waits = store.transition(conn, moved, RunState.WAITING_CHILDREN)
            if waits:
                _left(step, conn, waits)  # not EXECUTING: the planner reads the run once its children answered
            step_notices.waiting(step, conn, moved, "children", waits)
        return step.commit(conn, out)

    return _locked(step, _planning(iteration), execute, run, arrival)


def _left(step: Step, conn: Connection, run: RunRecord, seen: History | None = None,
          turn: Message | None = None) -> None:
    """Once ``conn``'s transaction has committed, the run as it left it is this process's planner's to know, and, with
    ``seen`` (what the model was shown: every message before the turn) and the turn as stored, its transcript: the
    next plan of it here may be made first (``model_first``). A run of a lineage starts from its source's messages,
    which are not its own: its transcript is read. The transcript is kept only for a run whose model may be asked
    first: any other's next plan reads what is new anyway, and holding its turns would only weigh."""
    store = step.rt.store
    agent = step.rt.agent(run.agent)
    planned = (seen, turn) if seen is not None and turn is not None and agent is not None \
        and _may_go_first(step, agent, run) else None

    def keep() -> None:
        step.rt.runs_left.keep(run)
        if planned is not None:
            store.keep_planned(run.run_id, run.iteration, *planned, run.version)

    store.after_commit(conn, keep)


def _repair(step: Step, run: RunRecord, new_messages: list[Message], iteration: int, planned: Planned,
            decision: Repair, seen: History, arrival: _Arrival | None = None) -> list[Envelope]:
    """Answer an unusable turn from here: the iteration's observations are the planner's, and the next
    iteration plans with them as it would with tools' results."""
    log.info("model turn told back for repair: %s", decision.fail.message,
             extra={"iteration": iteration, "error_code": decision.fail.code})
    observations = [Observation(call_id=call.id, tool=call.name, result=result) for call, result in decision.answers]
    event = step.event(EventType.OBSERVATION_RECORDED,
                       ObservationRecorded(agent=run.agent, iteration=iteration, observations=observations,
                                           repair=decision.note, planner=step.rt.tokens.get(PLANNER)),
                       key=(iteration, "observation"))
    store = step.rt.store

    def answer(conn: Connection, current: RunRecord) -> list[Envelope]:
        turn = _checkpoint(step, conn, run, iteration, new_messages, planned, repair=decision.fail.message,
                           arrival=arrival)
        moved = store.transition(conn, current, RunState.OBSERVING, **_usage_fields(current, planned.turn))
        if not moved:
            return step.commit(conn, [])
        _left(step, conn, moved, seen, turn)  # the run the repair's observation finds
        return step.commit(conn, [event])

    return _locked(step, _planning(iteration), answer, run, arrival)


def _end(step: Step, run: RunRecord, new_messages: list[Message], iteration: int, planned: Planned | None,
         status: ResultStatus, code: ErrorCode | None = None, message: str | None = None,
         output: dict[str, object] | None = None, arrival: _Arrival | None = None) -> list[Envelope]:
    def end(conn: Connection, current: RunRecord) -> list[Envelope]:
        return _end_in(step, conn, current, run, new_messages, iteration, planned, status, code, message, output,
                       arrival)

    return _locked(step, lambda current: not is_terminal(current.state) and current.iteration == iteration, end,
                   run, arrival)


def _end_in(step: Step, conn: Connection, current: RunRecord, run: RunRecord, new_messages: list[Message],
            iteration: int, planned: Planned | None, status: ResultStatus, code: ErrorCode | None = None,
            message: str | None = None, output: dict[str, object] | None = None,
            arrival: _Arrival | None = None) -> list[Envelope]:
    """End the run (``current``: its row, held in ``conn``'s transaction) with the iteration's checkpoint."""
    _checkpoint(step, conn, run, iteration, new_messages, planned, arrival=arrival)
    if planned is None:  # the plan step (if it began) ends with the run
        _finish_plan(step, conn, run, iteration, arrival, status="failed",
                     output={"error_code": code, "message": message}, duration_ms=0.0)
    turn = planned.turn if planned else None
    usage = _usage_fields(current, turn)
    ended = current.replace(**usage)
    result = result_of(ended, status=status, output=output, error_code=code, message=message,
                       recovery_suggestion=RECOVERY_SUGGESTIONS.get(code) if code else None)
    return end_run(step, conn, current, result, **usage)


def _planning(iteration: int) -> Callable[[RunRecord], bool]:
    """The run is still planning this iteration (what a plan step's outcome may be committed to)."""
    return lambda current: current.state == RunState.PLANNING and current.iteration == iteration
