"""Model output is input (issue "Containment", cases 9 and 10): a turn the fleet cannot store or must not run
is told back to the model, or ends the run with a code, before any of its calls is dispatched."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from agentfleet.errors import ErrorCode
from agentfleet.loop.budgets import Limits, charged, check_turn
from agentfleet.loop.decisions import Dispatch, Repair, decide, usable_turn
from agentfleet.loop.transcript import ModelTurn, ToolCall, Usage
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, wait_for_run

SCHEMA = {"type": "object"}


def turn(*calls: ToolCall) -> ModelTurn:
    return ModelTurn(tool_calls=list(calls))


@pytest.mark.parametrize("bad_id", ["a\x00b", "tab\there", "nl\n"])  # lone surrogates: ToolCall refuses them
def test_a_call_id_the_store_cannot_hold_is_replaced_and_the_turn_told_back(bad_id: str) -> None:
    got = decide(turn(ToolCall(id=bad_id, name="echo", arguments={})), SCHEMA, tools={"echo"}, repairs_left=1)
    assert isinstance(got, Repair)
    (answered, result), = got.answers
    assert answered.id == "call-0" and result.error_code == ErrorCode.INVALID_ARGUMENTS


def test_a_tool_name_with_a_nul_is_told_back_escaped() -> None:
    got = decide(turn(ToolCall(id="c", name="echo\x00rm", arguments={})), SCHEMA, tools={"echo"}, repairs_left=1)
    assert isinstance(got, Repair) and "\x00" not in got.note and "echo\\x00rm" in got.note
    assert all("\x00" not in call.name for call, _ in got.answers)


@pytest.mark.parametrize("arguments", [{"note": math.nan}, {"n": math.inf}, {"deep": [[{"x": -math.inf}]]},
                                       {"s": "a\x00b"}, {"k\x00": 1}, {"s": "\udfff"}])
def test_arguments_that_are_not_plain_json_are_an_unusable_turn(arguments: dict) -> None:
    got = decide(turn(ToolCall(id="c", name="echo", arguments=arguments)), SCHEMA, tools={"echo"}, repairs_left=1)
    assert isinstance(got, Repair) and got.fail.code == ErrorCode.INVALID_ARGUMENTS
    cleaned = usable_turn(turn(ToolCall(id="c", name="echo", arguments=arguments)))
    assert cleaned.tool_calls[0].arguments == {}  # nothing of it is stored or run


def test_nan_does_not_defeat_the_repeated_call_check() -> None:
    """Stored as null, {"note": NaN} three times looked like three different calls to the loop."""
    nan = turn(ToolCall(id="c", name="echo", arguments={"note": math.nan}))
    assert not isinstance(decide(nan, SCHEMA, tools={"echo"}, repairs_left=5), Dispatch)
    assert decide(nan, SCHEMA, tools={"echo"}, repairs_left=0).code == ErrorCode.INVALID_ARGUMENTS  # type: ignore[union-attr]


def test_a_turn_with_too_many_calls_runs_none_of_them() -> None:
    many = turn(*[ToolCall(id=f"c{i}", name="echo", arguments={"i": i}) for i in range(1000)])
    got = decide(many, SCHEMA, tools={"echo"}, repairs_left=1, max_calls=32)
    assert isinstance(got, Repair) and got.fail.code == ErrorCode.TOO_MANY_CALLS
    assert len(got.answers) == 1000 and all(not r.ok for _, r in got.answers)
    assert decide(many, SCHEMA, tools={"echo"}, repairs_left=0, max_calls=32).code == ErrorCode.TOO_MANY_CALLS  # type: ignore[union-attr]
    assert isinstance(decide(turn(*many.tool_calls[:32]), SCHEMA, tools={"echo"}, max_calls=32), Dispatch)


def test_a_clean_turn_is_left_as_it_is() -> None:
    clean = turn(ToolCall(id="c", name="echo", arguments={"text": "hi", "n": 1.5, "xs": [1, {"y": None}]}))
    assert usable_turn(clean) is clean


def test_a_turn_over_the_budget_is_caught_before_its_calls_run_and_size_counts_when_usage_under_reports() -> None:
    limits = Limits(max_tokens=200_000)
    assert check_turn(limits, Usage(input_tokens=1000, output_tokens=1000)) is None
    told = Usage(input_tokens=100, output_tokens=10)  # a server that under-reports a 5 MB answer
    counted = charged(told, written_tokens=1_250_000)
    assert counted.output_tokens == 1_250_000
    over = check_turn(limits, counted)
    assert over is not None and over.code == ErrorCode.TOKEN_BUDGET and "none of its calls was run" in over.message
    assert charged(told, written_tokens=2) == told


def test_limits_bound_the_calls_per_turn_and_a_goal_may_only_tighten_it() -> None:
    assert Limits().max_calls_per_turn == 32
    assert Limits(max_calls_per_turn=10).tightened_by({"max_calls_per_turn": 50}).max_calls_per_turn == 10
    with pytest.raises(ValueError):
        Limits(max_calls_per_turn=0)


# -- on the embedded fleet ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("ws"), "tests.fixtures.agents") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def ledger(fleet: EmbeddedFleet, run_id: str) -> list[str]:
    path = fleet.workspace / f"ledger-{run_id}.txt"  # type: ignore[attr-defined]
    return [line.split(":")[1] for line in path.read_text().splitlines()] if path.exists() else []


def test_nul_and_nan_from_the_model_are_told_back_and_the_run_goes_on(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "garbled", "input": {}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded", result
    assert ledger(fleet, run_id) == ["fine"]  # none of the three unusable turns ran anything
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    assert [bool(s["output"].get("repair")) for s in plans] == [True, True, True, False, False]


def test_a_turn_over_the_token_budget_runs_nothing(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "overspender", "input": {}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["error_code"] == ErrorCode.TOKEN_BUDGET, result
    assert "none of its calls was run" in result["message"]
    assert ledger(fleet, run_id) == [] and not [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"]


def test_a_turn_of_too_many_calls_runs_none_and_the_model_is_asked_for_fewer(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "sprayer", "input": {}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded", result
    assert sorted(ledger(fleet, run_id)) == ["f0", "f1"]
