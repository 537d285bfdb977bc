"""The sweeper's decision for a quiet run, from data alone."""

from __future__ import annotations

from typing import Any

from agentfleet.loop.recovery import Action, CallResume, intent_first, model_first, plan_redrive, resume_call
from agentfleet.loop.states import RunState


def ev(type: str, iteration: int | None = None, **extra: Any) -> dict[str, Any]:
    payload = {} if iteration is None else {"iteration": iteration}
    return {"type": type, "payload": payload, **extra}


STORED = [ev("tool.requested", 0, id="t0a"), ev("tool.requested", 0, id="t0b"), ev("tool.completed", 0),
          ev("observation.recorded", 0, id="o0"), ev("tool.requested", 1, id="t1")]


def plan(state: RunState, iteration: int, **kw: Any) -> Any:
    args = dict(elapsed_s=10.0, deadline_s=600.0, grace_s=60.0, in_flight=False, owes_result=False, stored=STORED)
    return plan_redrive(state=state, iteration=iteration, **{**args, **kw})


def test_an_executing_run_gets_every_call_of_its_iteration_again() -> None:
    p = plan(RunState.EXECUTING, 0)
    assert p.action == Action.REPUBLISH and [e["id"] for e in p.events] == ["t0a", "t0b"]


def test_a_planning_run_gets_the_observation_that_led_to_its_iteration() -> None:
    assert [e["id"] for e in plan(RunState.PLANNING, 1).events] == ["o0"]
    assert [e["id"] for e in plan(RunState.OBSERVING, 0).events] == ["o0"]


def test_a_run_at_its_first_plan_is_resubmitted() -> None:
    assert plan(RunState.PLANNING, 0).action == Action.RESUBMIT
    assert plan(RunState.PENDING, 0).action == Action.RESUBMIT


def test_a_held_step_or_a_wait_is_left_alone() -> None:
    assert plan(RunState.EXECUTING, 0, in_flight=True).action == Action.WAIT
    assert plan(RunState.WAITING_APPROVAL, 2).action == Action.WAIT


def test_a_stalled_run_past_its_deadline_and_grace_is_ended() -> None:
    assert plan(RunState.EXECUTING, 0, elapsed_s=661.0).action == Action.EXPIRE
    assert plan(RunState.EXECUTING, 0, elapsed_s=659.0).action == Action.REPUBLISH


def test_nothing_stored_is_said_not_guessed() -> None:
    assert plan(RunState.EXECUTING, 5).action == Action.UNKNOWN


def test_an_ended_run_owing_its_result_sends_it_again() -> None:
    stored = [*STORED, ev("run.completed", id="end")]
    p = plan(RunState.SUCCEEDED, 1, owes_result=True, stored=stored)
    assert p.action == Action.REPUBLISH and [e["id"] for e in p.events] == ["end"]
    assert plan(RunState.SUCCEEDED, 1, stored=stored).action == Action.WAIT


def test_a_run_whose_next_event_may_be_behind_a_backlog_is_waiting_not_stalled() -> None:
    from agentfleet.loop.recovery import waiting_in_line

    ready = {"planner": 0, "executor": 40, "observer": 0}
    assert waiting_in_line(RunState.EXECUTING, ready) == 40
    assert waiting_in_line(RunState.PLANNING, ready) == 0
    assert waiting_in_line(RunState.WAITING_APPROVAL, ready) == 0
    assert waiting_in_line(RunState.EXECUTING, {}) == 0  # depths unknown: judged on its own signs


def test_a_call_with_an_outcome_is_never_run_again_and_a_carried_outcome_is_committed_as_it_was() -> None:
    def how(status: str = "started", *, carried: bool = False, answered: bool = False,
            delegation: bool = False) -> CallResume:
        return resume_call(status=status, delegated="delegated", carried=carried, answered=answered,
                           delegation=delegation)

    assert how() == CallResume.RUN
    assert how(delegation=True) == CallResume.DELEGATE
    assert how("delegated", delegation=True) == CallResume.CHILD_ANSWERS  # its child answers: start none again
    for done in ("succeeded", "failed"):  # whatever the retry carries or a person said since
        assert how(done, carried=True, answered=True, delegation=True) == CallResume.STORED
    assert how(carried=True, answered=True, delegation=True) == CallResume.CARRIED  # ran before an outage
    assert how(answered=True, delegation=True) == CallResume.ANSWERED  # denied: no child run starts


def test_only_a_repeatable_call_that_runs_on_its_first_delivery_goes_without_an_intent() -> None:
    def first(**changed: bool) -> bool:
        facts = dict(repeatable=True, first_delivery=True, carried=False, answered=False, delegation=False)
        return intent_first(**{**facts, **changed}, timeout_s=30.0, stall_after_s=120.0)

    assert first() is False  # nothing to find, nothing lost: its step is written, finished, with the commit
    assert first(repeatable=False) is True  # a call that must not run twice: its intent before it runs
    assert first(first_delivery=False) is True  # maybe after an attempt that crashed its worker: counted
    assert first(carried=True) is True  # ran before an outage: its step holds what to commit
    assert first(answered=True) is True  # denied or answered by a person: recorded, not run
    assert first(delegation=True) is True  # a child run: its step says so


def test_a_call_that_may_outlast_the_sweepers_patience_is_held_while_it_runs() -> None:
    """A call with no intent holds no step: the sweeper would take its run, quiet that long, for stalled and send the
    call again. Only a tool whose timeout ends it well before then goes without (a resource lock waited for up to the
    timeout, then the call as long again, twice over)."""
    def first(timeout_s: float, stall_after_s: float = 120.0) -> bool:
        return intent_first(repeatable=True, first_delivery=True, carried=False, answered=False, delegation=False,
                            timeout_s=timeout_s, stall_after_s=stall_after_s)

    assert first(30.0) is False and first(1.0) is False
    assert first(31.0) is True and first(3600.0) is True
    assert first(30.0, stall_after_s=100.0) is True


def test_the_planner_asks_the_model_first_only_with_all_it_needs_known_and_a_short_call() -> None:
    def first(longest_call_s: float | None = 1.0, stall_after_s: float = 120.0, **changed: bool) -> bool:
        facts = dict(first_delivery=True, carried=False, run_known=True, transcript_known=True, plain=True)
        return model_first(**{**facts, **changed}, longest_call_s=longest_call_s, stall_after_s=stall_after_s)

    assert first() is True  # the move, the plan step and the decision: one commit after the call
    assert first(first_delivery=False) is False  # maybe after an attempt that crashed its worker: counted first
    assert first(carried=True) is False  # a turn an earlier attempt could not commit: its intent is there
    assert first(run_known=False) is False  # the run is read, with the intent
    assert first(transcript_known=False) is False  # the transcript is read, with the intent
    assert first(plain=False) is False  # a budget held in ancestors, a thread, a lineage, a summary: read first
    assert first(longest_call_s=None) is False  # a model that cannot say how long it may take: its step is held
    assert first(longest_call_s=60.0) is True and first(longest_call_s=61.0) is False  # the sweeper's patience
    assert first(longest_call_s=10.0, stall_after_s=19.0) is False
