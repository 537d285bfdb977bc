"""Calls a small model wrote as text (its server's parser missed them): read strictly, as model output is input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfleet.loop.transcript import ModelTurn
from agentfleet.models import OpenAIModel
from agentfleet.models.provider import calls_in_text

OFFERED = {"count_words", "final_answer"}


@pytest.mark.parametrize("text", [
    '{"name": "count_words", "arguments": {"text": "a b"}}\n',
    '```json\n{"name": "count_words", "arguments": {"text": "a b"}}\n```',
    '<tool_call>\n{"name": "count_words", "arguments": {"text": "a b"}}\n</tool_call>',
    '{"name": "count_words", "arguments": {"text": "a b"}}\n</tool_response>\n<tool_res',  # the model ran on
])
def test_a_call_written_bare_fenced_or_in_hermes_tags_is_read(text: str) -> None:
    assert calls_in_text(text, OFFERED) == [("count_words", {"text": "a b"})]


def test_what_follows_the_calls_is_the_model_running_on() -> None:
    # Measured on Qwen2.5-Coder-1.5B behind llama-server's /v1/messages: its calls, then fenced copies of the
    # answer's fields up to the output cap.
    text = ('{"name": "count_words", "arguments": {"text": "a"}}\n\n\n'
            '{"name": "final_answer", "arguments": {"words": 1, "longest": "a"}}\n\n\n'
            '```json\n{\n  "words": 1,\n  "longest": "a"\n}\n```\n\n\n```json\n{\n  "w')
    assert [name for name, _ in calls_in_text(text, OFFERED)] == ["count_words", "final_answer"]
    assert calls_in_text('{"words": 1}\n{"name": "count_words", "arguments": {}}', OFFERED) == []


def test_several_calls_one_after_another_are_read_in_order() -> None:
    text = ('{"name": "count_words", "arguments": {"text": "a"}}\n'
            '{"name": "final_answer", "arguments": {"words": 1, "longest": "a"}}')
    assert [name for name, _ in calls_in_text(text, OFFERED)] == ["count_words", "final_answer"]


@pytest.mark.parametrize("text", [
    "To solve this, count the words first.",
    'Here is the call: {"name": "count_words", "arguments": {}}',  # prose first: an answer, not a call
    '{"name": "rm_rf", "arguments": {}}',  # not offered
    '{"name": "count_words", "arguments": {}}\n{"name": "rm_rf", "arguments": {}}',  # one not offered: none
    '{"name": "count_words", "arguments": [1, 2]}',
    '{"name": "count_words", "arguments": {}, "extra": 1}',
    '{"name": 7, "arguments": {}}',
    '[{"name": "count_words", "arguments": {}}]',
    '{"name": "count_words", "arguments": {"text": "unterminated',
    "",
])
def test_anything_else_stays_text(text: str) -> None:
    assert calls_in_text(text, OFFERED) == []


@given(st.text(max_size=300))
def test_no_text_makes_the_reader_fail(text: str) -> None:
    found = calls_in_text(text, OFFERED)
    assert all(name in OFFERED and isinstance(args, dict) for name, args in found)


def _turn(text: str | None, stop: str = "stop") -> ModelTurn:
    return ModelTurn(text=text, stop_reason=stop, model="m")


def test_an_adapter_reads_text_calls_only_when_asked_and_only_when_the_server_gave_none() -> None:
    tools: list[dict[str, Any]] = [{"name": "count_words", "parameters": {"type": "object"}}]
    text = json.dumps({"name": "count_words", "arguments": {"text": "x"}}) + "\n\n\n"
    plain = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key_env=None)
    assert plain.read_text_calls(_turn(text), tools, 3).tool_calls == []
    reading = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key_env=None, text_tool_calls=True)
    turn = reading.read_text_calls(_turn(text, "length"), tools, 3)
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("i3t0", "count_words", {"text": "x"})]
    assert turn.text is None and turn.stop_reason == "tool_calls"


def test_text_after_tool_results_can_go_in_a_user_message_of_its_own() -> None:
    """llama-server's /v1/messages puts a message's text before its tool results; apart, the order holds."""
    from agentfleet.loop.transcript import Message, ToolCall
    from agentfleet.models.anthropic_messages import to_anthropic

    messages = [Message(role="assistant", tool_calls=[ToolCall(id="a", name="t")]),
                Message(role="tool", tool_call_id="a", content='{"ok": true}'),
                Message(role="user", content='{"goal": 1}')]
    _, merged = to_anthropic(messages)
    assert [m["role"] for m in merged] == ["assistant", "user"]
    assert [b["type"] for b in merged[1]["content"]] == ["tool_result", "text"]
    _, apart = to_anthropic(messages, user_text_apart=True)
    assert [(m["role"], [b["type"] for b in m["content"]]) for m in apart] == [
        ("assistant", ["tool_use"]), ("user", ["tool_result"]), ("user", ["text"])]
