from __future__ import annotations

import itertools

import pytest

from agentfleet.constants import FINAL_ANSWER_TOOL
from agentfleet.errors import ErrorCode
from agentfleet.loop import (
    TERMINAL,
    TRANSITIONS,
    Dispatch,
    Fail,
    Finish,
    Limits,
    Message,
    ModelTurn,
    Repair,
    RunState,
    ToolCall,
    Usage,
    can_transition,
    check_gates,
    decide,
    fan_in_complete,
    idempotency_key,
    run_id_for,
)
from agentfleet.loop.budgets import Termination, TreeLevel, check_tree, remaining
from agentfleet.loop.decisions import NO_PROGRESS_REPEATS, calls_signature, plan_signatures

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


def call(name: str, cid: str = "c1", **args: object) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=args)


class TestStateMachine:
    def test_every_state_has_a_row_in_the_transition_table(self) -> None:
        assert set(TRANSITIONS) == set(RunState)

    def test_terminal_states_have_no_way_out(self) -> None:
        for state in TERMINAL:
            assert TRANSITIONS[state] == frozenset()

    def test_every_live_state_can_fail_or_be_cancelled(self) -> None:
        for state in set(RunState) - TERMINAL:
            assert can_transition(state, RunState.FAILED)
            assert can_transition(state, RunState.CANCELLED)

    def test_the_loop_goes_plan_execute_observe_plan(self) -> None:
        path = [RunState.PENDING, RunState.PLANNING, RunState.EXECUTING, RunState.OBSERVING, RunState.PLANNING]
        assert all(can_transition(a, b) for a, b in itertools.pairwise(path))

    def test_only_planning_can_succeed(self) -> None:
        assert [s for s in RunState if can_transition(s, RunState.SUCCEEDED)] == [RunState.PLANNING]

    def test_executing_cannot_skip_back_to_planning(self) -> None:
        assert not can_transition(RunState.EXECUTING, RunState.PLANNING)


class TestGates:
    def test_nothing_trips_within_limits(self) -> None:
        assert check_gates(Limits(), Usage(), iteration=0, elapsed_s=0) is None

    @pytest.mark.parametrize(
        ("limits", "usage", "iteration", "elapsed", "code"),
        [
            (Limits(max_steps=3), Usage(), 3, 0.0, ErrorCode.MAX_STEPS),
            (Limits(max_tokens=100), Usage(input_tokens=60, output_tokens=40), 0, 0.0, ErrorCode.TOKEN_BUDGET),
            (Limits(max_cost_usd=0.5), Usage(cost_usd=0.5), 0, 0.0, ErrorCode.COST_BUDGET),
            (Limits(deadline_s=10), Usage(), 0, 10.0, ErrorCode.DEADLINE),
        ],
    )
    def test_each_gate_names_its_reason(self, limits: Limits, usage: Usage, iteration: int, elapsed: float,
                                        code: ErrorCode) -> None:
        gate = check_gates(limits, usage, iteration, elapsed)
        assert gate is not None and gate.code == code and gate.message

    def test_a_goal_can_tighten_limits_but_never_loosen_them(self) -> None:
        agent = Limits(max_steps=10, max_tokens=1000, max_cost_usd=1.0, deadline_s=60)
        tightened = agent.tightened_by({"max_steps": 3, "max_tokens": 10**9, "deadline_s": 600})
        assert tightened == Limits(max_steps=3, max_tokens=1000, max_cost_usd=1.0, deadline_s=60)

    def test_limits_reject_nonsense(self) -> None:
        with pytest.raises(ValueError):
            Limits(max_steps=0)


class TestDecisions:
    def test_tool_calls_are_dispatched_in_parallel(self) -> None:
        turn = ModelTurn(tool_calls=[call("a", "1"), call("b", "2")])
        decision = decide(turn, SCHEMA)
        assert isinstance(decision, Dispatch)
        assert [c.id for c in decision.calls] == ["1", "2"]

    def test_a_valid_final_answer_finishes(self) -> None:
        assert decide(ModelTurn(tool_calls=[call(FINAL_ANSWER_TOOL, n=3)]), SCHEMA) == Finish({"n": 3})

    def test_a_final_answer_that_breaks_the_result_schema_is_output_invalid(self) -> None:
        decision = decide(ModelTurn(tool_calls=[call(FINAL_ANSWER_TOOL, n="three")]), SCHEMA)
        assert isinstance(decision, Fail) and decision.code == ErrorCode.OUTPUT_INVALID
        assert any("n" in d for d in decision.details)

    def test_json_text_without_calls_is_taken_as_the_answer(self) -> None:
        assert decide(ModelTurn(text='{"n": 1}'), SCHEMA) == Finish({"n": 1})

    def test_prose_without_calls_is_output_invalid(self) -> None:
        decision = decide(ModelTurn(text="I think the answer is 3."), SCHEMA)
        assert isinstance(decision, Fail) and decision.code == ErrorCode.OUTPUT_INVALID

    def test_an_empty_turn_is_a_model_error(self) -> None:
        decision = decide(ModelTurn(), SCHEMA)
        assert isinstance(decision, Fail) and decision.code == ErrorCode.MODEL_ERROR

    def test_repeating_the_same_calls_is_no_progress(self) -> None:
        turn = ModelTurn(tool_calls=[call("a", x=1)])
        sig = calls_signature(turn.tool_calls)
        assert isinstance(decide(turn, SCHEMA, [sig] * (NO_PROGRESS_REPEATS - 2)), Dispatch)
        decision = decide(turn, SCHEMA, [sig] * (NO_PROGRESS_REPEATS - 1))
        assert isinstance(decision, Fail) and decision.code == ErrorCode.NO_PROGRESS

    def test_plan_signatures_are_read_off_the_assistant_turns_of_the_transcript(self) -> None:
        turns = [[call("a", "1", x=1)], [call("a", "2", x=1)], [call("b", x=2)]]
        transcript = [m for calls in turns for m in (ModelTurn(tool_calls=calls).as_message(),
                                                     Message(role="tool", tool_call_id="1", content="{}"))]
        transcript.append(Message(role="assistant", content="thinking aloud, no calls"))
        assert plan_signatures(transcript) == [calls_signature(calls) for calls in turns]
        assert plan_signatures(transcript, last=2) == [calls_signature(calls) for calls in turns[1:]]
        assert plan_signatures(transcript, last=5) == plan_signatures(transcript)
        # Two identical call sets in the history and the same again now: no progress.
        decision = decide(ModelTurn(tool_calls=[call("a", x=1)]), SCHEMA, plan_signatures(transcript[:4]))
        assert isinstance(decision, Fail) and decision.code == ErrorCode.NO_PROGRESS

    def test_call_signature_ignores_ids_and_order(self) -> None:
        assert calls_signature([call("a", "1", x=1), call("b", "2")]) == calls_signature(
            [call("b", "9"), call("a", "8", x=1)])
        assert calls_signature([call("a", x=1)]) != calls_signature([call("a", x=2)])

    def test_reused_call_ids_are_made_unique(self) -> None:
        decision = decide(ModelTurn(tool_calls=[call("a", "same"), call("b", "same")]), SCHEMA)
        assert isinstance(decision, Dispatch)
        assert len({c.id for c in decision.calls}) == 2

    def test_fan_in_is_complete_only_when_every_sibling_reported(self) -> None:
        assert not fan_in_complete(["a", "b"], ["a"])
        assert fan_in_complete(["a", "b"], ["b", "a"])


class TestRepairs:
    """An unusable turn is told back to the model while repairs are left, and fails with its code after."""

    def test_arguments_that_are_not_json_are_answered_by_call_id_and_nothing_of_the_turn_runs(self) -> None:
        turn = ModelTurn(tool_calls=[call("a", "1"), call("b", "2")], malformed={"2": "arguments are not JSON"})
        decision = decide(turn, SCHEMA, tools={"a", "b"}, repairs_left=1)
        assert isinstance(decision, Repair)
        answers = {c.id: r for c, r in decision.answers}
        assert answers["2"].error_code == ErrorCode.INVALID_ARGUMENTS and "not JSON" in answers["2"].message
        assert answers["1"].error_code == ErrorCode.NOT_RUN
        assert "could not be used" in decision.note

    def test_without_repairs_left_the_turn_fails_with_its_code(self) -> None:
        turn = ModelTurn(tool_calls=[call("a", "1")], malformed={"1": "arguments are not JSON"})
        decision = decide(turn, SCHEMA, tools={"a"}, repairs_left=0)
        assert isinstance(decision, Fail) and decision.code == ErrorCode.INVALID_ARGUMENTS

    def test_a_call_to_an_undeclared_tool_names_the_tools_there_are(self) -> None:
        decision = decide(ModelTurn(tool_calls=[call("rm_rf", "1")]), SCHEMA, tools={"a"}, repairs_left=1)
        assert isinstance(decision, Repair)
        (_, answer), = decision.answers
        assert answer.error_code == ErrorCode.UNKNOWN_TOOL and "'a'" not in answer.message
        assert "a, final_answer" in answer.message

    def test_a_cut_off_answer_is_repaired_even_when_its_calls_parse(self) -> None:
        turn = ModelTurn(tool_calls=[call("a", "1")], stop_reason="length")
        decision = decide(turn, SCHEMA, tools={"a"}, repairs_left=2)
        assert isinstance(decision, Repair) and decision.fail.code == ErrorCode.MODEL_ERROR
        assert "cut off" in decision.note and decision.answers[0][1].error_code == ErrorCode.MODEL_ERROR

    @pytest.mark.parametrize("turn", [ModelTurn(), ModelTurn(text="  "), ModelTurn(text="I think it is 3.")])
    def test_an_empty_or_prose_answer_asks_for_the_final_answer_tool(self, turn: ModelTurn) -> None:
        decision = decide(turn, SCHEMA, repairs_left=1)
        assert isinstance(decision, Repair) and decision.answers == ()
        assert FINAL_ANSWER_TOOL in decision.note

    def test_an_off_schema_final_answer_is_answered_with_the_schema_problems(self) -> None:
        decision = decide(ModelTurn(tool_calls=[call(FINAL_ANSWER_TOOL, "f", n="three")]), SCHEMA, repairs_left=1)
        assert isinstance(decision, Repair) and decision.fail.code == ErrorCode.OUTPUT_INVALID
        (done, answer), = decision.answers
        assert done.id == "f" and "n: 'three' is not of type 'integer'" in answer.message

    def test_an_undeclared_tool_beside_usable_calls_goes_to_the_executor(self) -> None:
        decision = decide(ModelTurn(tool_calls=[call("a", "1"), call("zz", "2")]), SCHEMA, tools={"a"}, repairs_left=1)
        assert isinstance(decision, Dispatch) and len(decision.calls) == 2

    def test_a_final_answer_beside_other_calls_is_not_taken_and_the_calls_run(self) -> None:
        """Written before the calls' results were in: a guess. The executor answers it NOT_RUN (roles/executor)."""
        turn = ModelTurn(tool_calls=[call("a", "1"), call(FINAL_ANSWER_TOOL, "f", n=3)])
        decision = decide(turn, SCHEMA, tools={"a"}, repairs_left=1)
        assert isinstance(decision, Dispatch) and [c.name for c in decision.calls] == ["a", FINAL_ANSWER_TOOL]
        assert isinstance(decide(ModelTurn(tool_calls=[call(FINAL_ANSWER_TOOL, "f", n=3)]), SCHEMA, tools={"a"},
                                 repairs_left=1), Finish)

    def test_a_usable_turn_spends_no_repair(self) -> None:
        assert isinstance(decide(ModelTurn(tool_calls=[call("a", "1")]), SCHEMA, tools={"a"}, repairs_left=1),
                          Dispatch)


class TestKeys:
    def test_the_same_goal_id_means_the_same_run(self) -> None:
        assert run_id_for("agent", "g1") == run_id_for("agent", "g1")
        assert run_id_for("agent", "g1") != run_id_for("other", "g1")

    def test_step_keys_are_deterministic_and_distinct(self) -> None:
        k = idempotency_key("r", 1, "tool", "c1")
        assert k == idempotency_key("r", 1, "tool", "c1")
        assert len({k, idempotency_key("r", 2, "tool", "c1"), idempotency_key("r", 1, "plan"),
                    idempotency_key("r", 1, "tool", "c2")}) == 4
def test_what_a_child_may_spend_is_what_is_left_and_the_tree_gate_names_the_level_that_ran_out() -> None:
    limits = Limits(max_steps=10, max_tokens=1000, max_cost_usd=1.0, deadline_s=60)
    used = Usage(input_tokens=300, output_tokens=100, cost_usd=0.25)
    left = remaining(limits, used, 2, 10.0)
    assert isinstance(left, Limits)
    assert (left.max_steps, left.max_tokens, left.max_cost_usd, left.deadline_s) == (8, 600, 0.75, 50.0)
    spent = remaining(limits, Usage(input_tokens=1000), 2, 10.0)
    assert isinstance(spent, Termination) and spent.code == ErrorCode.TOKEN_BUDGET
    # Each ancestor's spend counts its whole subtree, live: the first (the root first) over its limits stops
    # the run about to plan, with the same code a single run gets.
    root = TreeLevel("run r (root)", limits, Usage(input_tokens=990, output_tokens=20), 3, 5.0)
    middle = TreeLevel("run m (middle)", Limits(max_tokens=500), Usage(input_tokens=100), 2, 5.0)
    stopped = check_tree([root, middle])
    assert stopped is not None and stopped.code == ErrorCode.TOKEN_BUDGET
    assert stopped.message.startswith("the tree's budget, at run r (root): used 1010 tokens")
    assert check_tree([middle]) is None and check_tree([]) is None
    late = TreeLevel("run r (root)", limits, Usage(), 1, 61.0)
    assert check_tree([late]).code == ErrorCode.DEADLINE  # type: ignore[union-attr]


def test_a_delegated_goal_id_names_its_parent_and_no_other_does() -> None:
    from agentfleet.loop.keys import child_goal_id, parent_of

    assert parent_of(child_goal_id("run-1", "call/with/slashes")) == ("run-1", "call/with/slashes")
    assert [parent_of(g) for g in (None, "", "g-1", "delegation/", "delegation/run-1", "trigger/e/a")] == [None] * 6
