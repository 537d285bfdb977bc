"""The OpenAI-compatible and Anthropic adapters against a local HTTP server speaking each provider's
documented wire format: the exact requests sent, and every answer and failure turned into a turn or a
ModelError of the right kind. No internet, no key."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from agentfleet.errors import ConfigurationError, ModelAuthError, ModelError, ModelUnavailable
from agentfleet.loop.transcript import Message, ToolCall
from agentfleet.models import AnthropicModel, ModelRequest, OpenAIModel, model_from_spec
from agentfleet.models.replay import ReplayModel

TOOLS = [{"name": "lookup", "description": "Look a word up.",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}]
HISTORY = [
    Message(role="system", content="Be brief."),
    Message(role="user", content='{"goal": {"word": "fleet"}}'),
    Message(role="assistant", content=None, tool_calls=[ToolCall(id="call_a", name="lookup", arguments={"word": "a"}),
                                                        ToolCall(id="call_b", name="lookup", arguments={"word": "b"})]),
    Message(role="tool", tool_call_id="call_a", name="lookup", content='{"ok": true, "output": 1}'),
    Message(role="tool", tool_call_id="call_b", name="lookup", content='{"error_code": "TIMEOUT", "ok": false}'),
    Message(role="user", name="agentfleet_repair", content="Try again."),
]


def request(messages: list[Message] = HISTORY) -> ModelRequest:
    return ModelRequest(run_id="r1", agent="a", iteration=1, goal={"word": "fleet"}, messages=messages, tools=TOOLS)


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    with HTTPServer(host="127.0.0.1", port=0) as running:
        yield running


def sent(server: HTTPServer) -> list[dict[str, Any]]:
    return [json.loads(req.get_data()) for req, _ in server.log]


def completion(message: dict[str, Any], finish: str = "tool_calls", usage: dict[str, Any] | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4.1-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": usage or {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
                               "prompt_tokens_details": {"cached_tokens": 400}}}


def openai_model(server: HTTPServer, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> OpenAIModel:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    return OpenAIModel("gpt-4.1-mini", base_url=server.url_for("/v1"), **kw)


class TestOpenAI:
    def test_the_transcript_goes_out_as_chat_messages_matched_by_call_id(self, server: HTTPServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/chat/completions", method="POST").respond_with_json(completion({
            "content": "", "tool_calls": [
                {"id": "call_c", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "c"}'}},
                {"id": "call_d", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "d"}'}},
            ]}))
        turn = openai_model(server, monkeypatch).complete(request())
        (body,) = sent(server)
        assert server.log[0][0].headers["Authorization"] == "Bearer sk-test-key"
        assert body["model"] == "gpt-4.1-mini"
        assert body["tools"] == [{"type": "function", "function": TOOLS[0]}]
        assert body["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": '{"goal": {"word": "fleet"}}'},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "a"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "b"}'}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": '{"ok": true, "output": 1}'},
            {"role": "tool", "tool_call_id": "call_b", "content": '{"error_code": "TIMEOUT", "ok": false}'},
            {"role": "user", "content": "Try again."},
        ]
        assert [(c.id, c.arguments) for c in turn.tool_calls] == [("call_c", {"word": "c"}), ("call_d", {"word": "d"})]
        assert turn.text is None and turn.stop_reason == "tool_calls" and not turn.malformed

    def test_usage_is_priced_from_the_table_with_cached_input_cheaper(self, server: HTTPServer,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/chat/completions").respond_with_json(completion({"content": "{}"}, "stop"))
        usage = openai_model(server, monkeypatch).complete(request()).usage
        assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (1000, 400, 50)
        assert usage.cost_usd == pytest.approx((600 * 0.4 + 400 * 0.1 + 50 * 1.6) / 1e6) and not usage.unpriced

    def test_a_model_without_a_price_is_unpriced_not_free(self, server: HTTPServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/chat/completions").respond_with_json(completion({"content": "{}"}, "stop"))
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        usage = OpenAIModel("my-finetune", base_url=server.url_for("/v1")).complete(request()).usage
        assert usage.unpriced and usage.cost_usd == 0 and usage.input_tokens == 1000

    def test_arguments_that_are_not_json_and_missing_ids_are_kept_for_repair(self, server: HTTPServer,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/chat/completions").respond_with_json(completion({"content": "", "tool_calls": [
            {"id": "", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "c"'}},
            {"id": "x", "type": "function", "function": {"name": "lookup", "arguments": '["c"]'}}]}))
        turn = openai_model(server, monkeypatch).complete(request())
        assert [c.id for c in turn.tool_calls] == ["i1c0", "x"]
        assert "not JSON" in turn.malformed["i1c0"] and "JSON object" in turn.malformed["x"]

    def test_a_cut_off_answer_says_length(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/chat/completions").respond_with_json(completion({"content": '{"a": '}, "length"))
        assert openai_model(server, monkeypatch).complete(request()).stop_reason == "length"

    @pytest.mark.parametrize(("status", "headers", "kind", "retry_after"), [
        (429, {"Retry-After": "7"}, ModelUnavailable, 7.0),
        (429, {"retry-after-ms": "1500"}, ModelUnavailable, 1.5),
        (500, {}, ModelUnavailable, None),
        (503, {}, ModelUnavailable, None),
        (401, {}, ModelAuthError, None),
        (400, {}, ModelError, None),
    ])
    def test_each_error_is_sorted_into_retry_or_not_and_sent_once(
            self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch, status: int, headers: dict[str, str],
            kind: type[ModelError], retry_after: float | None) -> None:
        body = {"error": {"message": f"said with {status}", "type": "x", "code": None}}
        server.expect_request("/v1/chat/completions").respond_with_json(body, status=status, headers=headers)
        with pytest.raises(ModelError) as raised:
            openai_model(server, monkeypatch).complete(request())
        assert type(raised.value) is kind and f"said with {status}" in str(raised.value)
        assert raised.value.retryable == (kind is ModelUnavailable)
        assert getattr(raised.value, "retry_after_s", None) == retry_after
        assert len(server.log) == 1  # the SDK's own retries are off: one layer retries
        if status >= 500:
            assert "status.openai.com" in str(raised.value)

    def test_the_context_window_error_is_not_retried_and_says_so(self, server: HTTPServer,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        body = {"error": {"message": "This model's maximum context length is 8192 tokens", "code": "context_length"}}
        server.expect_request("/v1/chat/completions").respond_with_json(body, status=400)
        with pytest.raises(ModelError, match="context window") as raised:
            openai_model(server, monkeypatch).complete(request())
        assert not raised.value.retryable

    def test_a_stalled_server_times_out_as_unavailable(self, server: HTTPServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        def stall(_: Request) -> Response:
            time.sleep(1.5)
            return Response("{}", content_type="application/json")

        server.expect_request("/v1/chat/completions").respond_with_handler(stall)
        with pytest.raises(ModelUnavailable, match="APITimeoutError"):
            openai_model(server, monkeypatch, timeout_s=0.3).complete(request())

    def test_a_truncated_body_is_unavailable_not_a_crash(self, server: HTTPServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/chat/completions").respond_with_data('{"id": "x", "choices": [',
                                                                         content_type="application/json")
        with pytest.raises(ModelUnavailable, match="cut off"):
            openai_model(server, monkeypatch).complete(request())

    def test_exact_counts_apply_the_template_and_tokenize_on_llama_server(self, server: HTTPServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/apply-template").respond_with_json({"prompt": "<|im_start|>system ..."})
        server.expect_request("/tokenize").respond_with_json({"tokens": [1, 2, 3, 4]})
        model = openai_model(server, monkeypatch, llama_server_tokenizer=True)
        assert model.count_tokens(HISTORY, TOOLS) == 4
        template, tokenize = sent(server)
        assert [m["role"] for m in template["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
        assert template["tools"][0]["function"]["name"] == "lookup"
        assert tokenize == {"content": "<|im_start|>system ..."}

    def test_a_tokenizer_that_fails_is_no_count(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/apply-template").respond_with_json({"nope": 1})
        assert openai_model(server, monkeypatch, llama_server_tokenizer=True).count_tokens(HISTORY, TOOLS) is None
        assert openai_model(server, monkeypatch).count_tokens(HISTORY, TOOLS) is None and len(server.log) == 1

    def test_a_missing_key_names_the_variable_when_the_agent_is_declared(self,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
            OpenAIModel("gpt-4.1-mini")


def anthropic_reply(content: list[dict[str, Any]], stop: str = "tool_use") -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5", "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 300, "output_tokens": 40, "cache_read_input_tokens": 700,
                      "cache_creation_input_tokens": 0}}


class TestAnthropic:
    def model(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> AnthropicModel:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
        return AnthropicModel("claude-haiku-4-5", base_url=server.url_for(""))

    def test_the_transcript_goes_out_as_messages_with_alternating_roles(self, server: HTTPServer,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/messages", method="POST").respond_with_json(anthropic_reply([
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"word": "c"}},
            {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"word": "d"}}]))
        turn = self.model(server, monkeypatch).complete(request())
        (body,) = sent(server)
        headers = server.log[0][0].headers  # the SDK chooses x-api-key or a bearer token
        assert "sk-ant-test" in (headers.get("x-api-key") or headers.get("Authorization") or "")
        assert body["system"] == "Be brief." and body["max_tokens"] == 4096
        assert body["tools"] == [{"name": "lookup", "description": "Look a word up.",
                                  "input_schema": TOOLS[0]["parameters"]}]
        assert body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": '{"goal": {"word": "fleet"}}'}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_a", "name": "lookup", "input": {"word": "a"}},
                {"type": "tool_use", "id": "call_b", "name": "lookup", "input": {"word": "b"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": '{"ok": true, "output": 1}'},
                {"type": "tool_result", "tool_use_id": "call_b", "content": '{"error_code": "TIMEOUT", "ok": false}',
                 "is_error": True},
                {"type": "text", "text": "Try again."}]},
        ]
        assert turn.text == "Looking." and [c.id for c in turn.tool_calls] == ["toolu_1", "toolu_2"]
        assert turn.stop_reason == "tool_calls"
        usage = turn.usage
        assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (1000, 700, 40)
        assert usage.cost_usd == pytest.approx((300 * 1.0 + 700 * 0.1 + 40 * 5.0) / 1e6)

    def test_temperature_reaches_the_server(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/messages").respond_with_json(anthropic_reply([{"type": "text", "text": "{}"}]))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        AnthropicModel("claude-haiku-4-5", base_url=server.url_for(""), temperature=0).complete(request())
        assert sent(server)[0]["temperature"] == 0

    def test_max_tokens_is_a_cut_off_answer(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/messages").respond_with_json(anthropic_reply([{"type": "text", "text": "{"}],
                                                                                "max_tokens"))
        assert self.model(server, monkeypatch).complete(request()).stop_reason == "length"

    def test_llama_cpp_unreadable_output_is_a_turn_to_repair(self, server: HTTPServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
        said = "The model produced output that does not match the expected peg-native format"
        server.expect_request("/v1/messages").respond_with_json(
            {"error": {"code": 500, "message": said, "type": "server_error"}}, status=500)
        turn = self.model(server, monkeypatch).complete(request())
        assert turn.stop_reason == "unparsed" and turn.text == said and len(server.log) == 1

    @pytest.mark.parametrize(("status", "kind"), [(529, ModelUnavailable), (429, ModelUnavailable),
                                                  (401, ModelAuthError), (400, ModelError)])
    def test_errors(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch, status: int,
                    kind: type[ModelError]) -> None:
        body = {"type": "error", "error": {"type": "overloaded_error", "message": f"status {status}"}}
        server.expect_request("/v1/messages").respond_with_json(body, status=status, headers={"retry-after": "3"})
        with pytest.raises(ModelError) as raised:
            self.model(server, monkeypatch).complete(request())
        assert type(raised.value) is kind and f"status {status}" in str(raised.value) and len(server.log) == 1
        if kind is ModelUnavailable:
            assert raised.value.retry_after_s == 3.0

    @pytest.mark.parametrize(("choice", "wire"), [("required", {"type": "any"}), ("auto", {"type": "auto"}),
                                                  ("none", {"type": "none"})])
    def test_tool_choice_is_said_in_the_messages_vocabulary(self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch,
                                                             choice: str, wire: dict[str, str]) -> None:
        # The same words as OpenAIModel's; llama-server's /v1/messages maps {"type": "any"} back to "required"
        # and reads nothing else of a request body it does not know (tools/server/server-chat.cpp).
        server.expect_request("/v1/messages").respond_with_json(anthropic_reply([{"type": "text", "text": "{}"}]))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        model = AnthropicModel("claude-haiku-4-5", base_url=server.url_for(""), tool_choice=choice)
        model.complete(request())
        model.complete(request().model_copy(update={"tools": []}))
        with_tools, without = sent(server)
        assert with_tools["tool_choice"] == wire and "tool_choice" not in without

    def test_a_tool_choice_it_does_not_know_is_refused_when_declared(self) -> None:
        with pytest.raises(ConfigurationError, match="tool_choice"):
            AnthropicModel("claude-haiku-4-5", api_key_env=None, tool_choice="always")

    def test_exact_counts_ask_the_server_for_the_prompt_it_would_send(self, server: HTTPServer,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/messages/count_tokens").respond_with_json({"input_tokens": 321})
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        model = AnthropicModel("claude-haiku-4-5", base_url=server.url_for(""), exact_counts=True)
        assert model.count_tokens(HISTORY, TOOLS) == 321
        (body,) = sent(server)
        assert body["system"] == "Be brief." and body["tools"][0]["name"] == "lookup"
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]

    def test_a_count_that_fails_is_no_count_and_without_exact_counts_none_is_asked(
            self, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
        server.expect_request("/v1/messages/count_tokens").respond_with_json({"error": "no"}, status=500)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        model = AnthropicModel("claude-haiku-4-5", base_url=server.url_for(""), exact_counts=True)
        assert model.count_tokens(HISTORY, TOOLS) is None and len(server.log) == 1
        assert self.model(server, monkeypatch).count_tokens(HISTORY, TOOLS) is None and len(server.log) == 1

    def test_a_missing_key_names_the_variable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
        with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
            AnthropicModel("claude-haiku-4-5")


class TestSpecs:
    def test_each_kind(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        assert model_from_spec("openai:gpt-4.1-mini").name == "gpt-4.1-mini"
        assert model_from_spec("anthropic:claude-haiku-4-5").name == "claude-haiku-4-5"
        local = model_from_spec("openai-compatible:http://127.0.0.1:8080/v1:qwen2.5:0.5b")
        assert isinstance(local, OpenAIModel) and (local.model, local.base_url) == ("qwen2.5:0.5b",
                                                                                     "http://127.0.0.1:8080/v1")
        bare = model_from_spec("anthropic-compatible:http://127.0.0.1:8080:smollm2")
        assert isinstance(bare, AnthropicModel) and bare.model == "smollm2"
        cassette = tmp_path / "c.json"
        cassette.write_text('{"model": "m", "turns": []}')
        assert isinstance(model_from_spec(f"replay:{cassette}"), ReplayModel)

    @pytest.mark.parametrize("spec", ["gpt-4", "openai:", "mystery:x", "openai-compatible:127.0.0.1:8080:m"])
    def test_a_bad_spec_says_the_forms(self, spec: str) -> None:
        with pytest.raises(ConfigurationError, match="model spec"):
            model_from_spec(spec)


def test_llama_cpp_unreadable_output_is_a_turn_to_repair_not_an_outage(server: HTTPServer,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from agentfleet.loop.decisions import Repair, decide

    said = "The model produced output that does not match the expected peg-native format"
    server.expect_request("/v1/chat/completions").respond_with_json(
        {"error": {"code": 500, "message": said, "type": "server_error"}}, status=500)
    turn = openai_model(server, monkeypatch).complete(request())
    assert turn.stop_reason == "unparsed" and said in (turn.text or "") and len(server.log) == 1
    decision = decide(turn, {"type": "object"}, repairs_left=1)
    assert isinstance(decision, Repair) and "could not be read" in decision.note
