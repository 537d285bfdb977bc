from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentfleet.constants import REPAIR_MESSAGE_NAME
from agentfleet.context import build_messages, estimate_tokens
from agentfleet.context.builder import tokens_for
from agentfleet.loop import Message, ToolCall
from agentfleet.loop.transcript import History, message_chars


def transcript(n: int, size: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", name="t", arguments={})]))
        out.append(Message(role="tool", tool_call_id=f"c{i}", content=json.dumps({"data": "x" * size})))
    return out


def test_instructions_and_goal_lead_the_context() -> None:
    messages = build_messages("Be brief.", {"path": "."}, [], budget_tokens=10_000)
    assert [m.role for m in messages] == ["system", "user"]
    assert "Be brief." in (messages[0].content or "") and "final_answer" in (messages[0].content or "")
    assert json.loads(messages[1].content or "") == {"goal": {"path": "."}}


def test_a_transcript_within_budget_is_kept_whole() -> None:
    body = transcript(3, 100)
    assert build_messages("i", {}, body, budget_tokens=100_000)[2:] == body


def test_over_budget_the_oldest_tool_results_are_elided_first() -> None:
    body = transcript(5, 4000)
    messages = build_messages("i", {}, body, budget_tokens=3000)
    tools = [m for m in messages if m.role == "tool"]
    assert json.loads(tools[0].content or "").get("elided") is True
    assert "elided" not in (tools[-1].content or "")  # the latest results are what the model acts on
    assert estimate_tokens(messages) < estimate_tokens(build_messages("i", {}, body, budget_tokens=10**9))


def test_building_context_does_not_change_the_transcript() -> None:
    body = transcript(4, 4000)
    before = [m.model_copy(deep=True) for m in body]
    build_messages("i", {}, body, budget_tokens=100)
    assert body == before


def test_the_prompt_budget_is_the_runs_and_no_more_than_the_models_window_allows() -> None:
    from agentfleet.context.builder import context_budget

    assert context_budget(200_000, None) == 200_000
    assert context_budget(200_000, 8192) == 6144  # three quarters: the rest is the answer's
    assert context_budget(1000, 8192) == 1000


def test_an_agents_worked_example_comes_between_the_instructions_and_the_goal() -> None:
    example = [Message(role="user", content='{"goal": {"path": "x"}}'),
               Message(role="assistant", tool_calls=[ToolCall(id="ex", name="ls", arguments={"path": "x"})]),
               Message(role="tool", tool_call_id="ex", content='{"ok": true}')]
    messages = build_messages("i", {"path": "."}, [], budget_tokens=10_000, examples=example)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[1:4] == example and json.loads(messages[4].content or "") == {"goal": {"path": "."}}


# -- sizing a transcript kept as it grows (History) ------------------------------------------------------------------

_texts = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
_messages = st.lists(st.builds(
    Message,
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    content=st.none() | _texts,
    tool_calls=st.lists(st.builds(ToolCall, id=st.text("abc", min_size=1, max_size=4), name=st.just("t"),
                                  arguments=st.dictionaries(st.text("xyz", max_size=3), st.integers() | _texts,
                                                            max_size=3)), max_size=2),
    tool_call_id=st.none() | st.text("abc", max_size=4),
    name=st.none() | st.sampled_from(["t", REPAIR_MESSAGE_NAME]),
), max_size=12)


@given(_messages)
def test_a_transcript_sized_from_its_kept_sum_is_sized_as_if_serialized_whole(messages: list[Message]) -> None:
    assert tokens_for(sum(map(message_chars, messages)), len(messages)) == estimate_tokens(messages)


@given(_messages, _messages, st.integers(min_value=1, max_value=400))
def test_a_history_kept_message_by_message_builds_the_prompt_a_whole_transcript_would(
        first: list[Message], then: list[Message], budget: int) -> None:
    kept = History.of(first).plus(then)
    whole = [*first, *then]
    assert kept.messages == whole
    assert kept.repairs == sum(1 for m in whole if m.role == "user" and m.name == REPAIR_MESSAGE_NAME)
    assert (build_messages("i", {"g": 1}, kept.messages, budget, notice="n", transcript_chars=kept.chars)
            == build_messages("i", {"g": 1}, whole, budget, notice="n"))
