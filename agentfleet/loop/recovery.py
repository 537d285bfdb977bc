"""What to do about a run that has gone quiet, decided from data alone; the sweeper acts on it.

A run goes quiet when the event that should move it on never arrives: its publish was
lost after the step committed, or its message was acked by a worker that then could not
finish. The way out is to send again the events the run's last committed step stored —
every consumer dedupes on the event id and republishes its own stored outcome, so a
re-drive that races a late message is harmless — or, at the run's first plan, the goal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentfleet.loop.states import RunState, is_terminal


class Action(StrEnum):
    REPUBLISH = "republish"  # send the stored events that move the run on again
    RESUBMIT = "resubmit"  # the run is at its first plan: hand the planner its goal again
    EXPIRE = "expire"  # past its deadline with nothing moving: end it with DEADLINE
    WAIT = "wait"  # a live worker holds one of its steps, or it waits on people or children
    UNKNOWN = "unknown"  # nothing stored to re-drive from (said, never guessed at)


# The role whose queue a run's next event waits in, by the run's state (waits have none).
NEXT_CONSUMER: dict[RunState, str] = {
    RunState.PENDING: "planner",
    RunState.PLANNING: "planner",
    RunState.OBSERVING: "planner",
    RunState.EXECUTING: "executor",
    RunState.SUCCEEDED: "observer",
    RunState.FAILED: "observer",
    RunState.CANCELLED: "observer",
}


WAITS: frozenset[RunState] = frozenset({RunState.WAITING_APPROVAL, RunState.WAITING_CHILDREN})


def waiting_within_deadline(state: RunState, elapsed_s: float, deadline_s: float, grace_s: float) -> bool:
    """A run that waits on people or children, not yet past its deadline: there is nothing to re-drive,
    so the sweeper need not read its steps (a thousand parked runs would cost it four queries each)."""
    return state in WAITS and elapsed_s <= deadline_s + grace_s


def waiting_in_line(state: RunState, ready: dict[str, int]) -> int:
    """How many messages wait, ready, in the queue the run's next event goes to. A run whose event
    may simply be behind them is waiting its turn, not stalled: re-driving it would only add copies."""
    role = NEXT_CONSUMER.get(state)
    return ready.get(role, 0) if role else 0


@dataclass(frozen=True)
class Redrive:
    action: Action
    reason: str
    events: tuple[dict[str, Any], ...] = field(default=())


def plan_redrive(*, state: RunState, iteration: int, elapsed_s: float, deadline_s: float, grace_s: float,
                 in_flight: bool, owes_result: bool, stored: Sequence[dict[str, Any]]) -> Redrive:
    """The move for one quiet run. ``stored`` is every event its handled steps produced, oldest first."""
    if is_terminal(state):
        ended = [e for e in stored if e.get("type") in ("run.completed", "run.failed")]
        if owes_result and ended:
            return Redrive(Action.REPUBLISH, "ended, but its Result was not delivered", (ended[-1],))
        return Redrive(Action.WAIT if not owes_result else Action.UNKNOWN, "ended")
    if in_flight:
        return Redrive(Action.WAIT, "a live worker holds one of its steps")
    if elapsed_s > deadline_s + grace_s:
        return Redrive(Action.EXPIRE, f"ran {elapsed_s:.0f}s, past its deadline of {deadline_s:g}s, and is stalled")
    if state == RunState.PENDING or (state == RunState.PLANNING and iteration == 0):
        return Redrive(Action.RESUBMIT, "its first plan was never made")
    if state in WAITS:
        return Redrive(Action.WAIT, f"{state.value.lower()} (a wait, not a stall)")
    wanted = {
        RunState.PLANNING: ("observation.recorded", iteration - 1),
        RunState.OBSERVING: ("observation.recorded", iteration),
        RunState.EXECUTING: ("tool.requested", iteration),
    }[state]
    events = tuple(e for e in stored if e.get("type") == wanted[0]
                   and (e.get("payload") or {}).get("iteration") == wanted[1])
    if not events:
        return Redrive(Action.UNKNOWN, f"no stored {wanted[0]} for iteration {wanted[1]}")
    return Redrive(Action.REPUBLISH, f"{state.value} at iteration {iteration} with nothing in flight", events)


class CallResume(StrEnum):
    """How the executor goes on with a tool call it is handed, from what its step recorded: a call is never
    run again once it has an outcome, and an outcome an earlier attempt knew is committed, not recomputed."""

    CHILD_ANSWERS = "child-answers"  # handed to a child run before: its Result will answer the call
    DELEGATE = "delegate"  # a delegate call met for the first time: start the child run (or say why not)
    STORED = "stored"  # finished before: its stored result, never run again
    CARRIED = "carried"  # ran before a database outage: commit the result the retry carried
    ANSWERED = "answered"  # the policy or a person answered it: nothing runs
    RUN = "run"  # run it (the attempt itself says UNKNOWN_OUTCOME for a non-idempotent tool that died mid-call)


def resume_call(*, status: str, delegated: str, carried: bool, answered: bool, delegation: bool) -> CallResume:
    """The move for one tool call. ``status`` is its step's (``started`` while it has no outcome; ``delegated``
    names the delegated status); ``carried``: the retry carries an outcome; ``answered``: the policy or a person
    gave one; ``delegation``: a ``delegate`` call of an agent that delegates."""
    if status == delegated:
        return CallResume.CHILD_ANSWERS
    if status != "started":
        return CallResume.STORED
    if carried:
        return CallResume.CARRIED
    if answered:
        return CallResume.ANSWERED
    return CallResume.DELEGATE if delegation else CallResume.RUN


# A call goes without an intent only if its longest handling (a resource lock waited for up to the tool's timeout,
# then the call for as long again) fits this many times in the time after which the sweeper takes a run with no
# step held for stalled, and sends its call again.
STALL_OVER_LONGEST_CALL = 2.0


def intent_first(*, repeatable: bool, first_delivery: bool, carried: bool, answered: bool, delegation: bool,
                 timeout_s: float, stall_after_s: float) -> bool:
    """Whether a tool call's intent is written before it runs. Only a call that runs (nothing carried, answered or
    delegated) of a tool that may run again with no harm (``repeatable``), on the message's first delivery, goes
    without: there is no earlier attempt to find, and one that dies mid-call is redelivered, marked so, and that
    attempt writes its intent first, which counts it toward the limit on attempts that crash their worker. Its step
    is written once, finished, with the handling's commit (DBOS's way with a step: checkpointed after it ran).

    A call that goes without holds no step either, so the sweeper cannot tell it is running: only a tool whose
    timeout (``timeout_s``) ends it well before the sweeper would call its run stalled (``stall_after_s``) goes
    without; a longer one is held, and a run waiting on it is not sent its call again."""
    short = 2 * timeout_s * STALL_OVER_LONGEST_CALL <= stall_after_s
    return not (repeatable and short and first_delivery and not carried and not answered and not delegation)


def model_first(*, first_delivery: bool, carried: bool, run_known: bool, transcript_known: bool, plain: bool,
                longest_call_s: float | None, stall_after_s: float) -> bool:
    """Whether the planner asks the model before it writes anything of the iteration, and commits the run's move to
    it, the plan step (finished) and the decision in one transaction (one round trip), as ``intent_first`` lets a
    repeatable call run first: a model turn, like such a call, may be asked for again with no harm but its cost.

    Only on the message's first delivery (a planner that dies mid-call is redelivered, marked so, and that attempt
    writes the intent first, counting the one that died), with no turn carried from an attempt that could not commit,
    when this process knows the run (``RunsLeft``) and its transcript through the last turn (its planner committed
    both), for a run that needs nothing read before its call (``plain``: no ancestors' budgets to hold, no thread, no
    lineage, no summary to write); and only for a model that says how long one call can take at most
    (``longest_call_s``), short enough that the sweeper, which cannot tell the call is running (no step is held), would
    not take the run for stalled first. Anything else, or a try that fails and may be retried, takes the two
    transactions: the intent and the step's lock, the call, then the decision."""
    short = longest_call_s is not None and longest_call_s * STALL_OVER_LONGEST_CALL <= stall_after_s
    return first_delivery and not carried and run_known and transcript_known and plain and short
