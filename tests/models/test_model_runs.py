"""Whole runs on a model behind a local server speaking OpenAI's wire format, chosen by AGENTFLEET_MODELS:
a rate limit retried after the time asked, a small model's broken arguments repaired, usage and cost in the
Result."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from agentfleet.errors import ErrorCode
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, wait_for_run


@pytest.fixture(scope="module")
def server() -> Iterator[HTTPServer]:
    with HTTPServer(host="127.0.0.1", port=0) as running:
        yield running


@pytest.fixture(scope="module")
def fleet(server: HTTPServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    models = {"wired": f"openai-compatible:{server.url_for('/v1')}:gpt-4.1-mini"}
    with embedded_fleet(tmp_path_factory.mktemp("ws"), "tests.fixtures.agents",
                        AGENTFLEET_MODELS=json.dumps(models), AGENTFLEET_MODEL_RETRY_MAX_DELAY_S="1") as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh(server: HTTPServer) -> Iterator[None]:
    server.clear()
    yield


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply(*calls: dict[str, Any], finish: str = "tool_calls") -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "created": 1, "model": "gpt-4.1-mini",
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": "", "tool_calls": list(calls)}}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 20, "total_tokens": 220}}


def sent(server: HTTPServer) -> list[dict[str, Any]]:
    return [json.loads(req.get_data()) for req, _ in server.log]


def test_a_rate_limit_is_waited_out_broken_arguments_repaired_and_the_run_succeeds(
        fleet: EmbeddedFleet, server: HTTPServer) -> None:
    endpoint = "/v1/chat/completions"
    server.expect_ordered_request(endpoint).respond_with_json(
        {"error": {"message": "slow down", "type": "rate_limit"}}, status=429, headers={"retry-after-ms": "50"})
    server.expect_ordered_request(endpoint).respond_with_json(reply(call("k1", "slow_echo", '{"text": "hi"')))
    server.expect_ordered_request(endpoint).respond_with_json(reply(call("k2", "slow_echo", '{"text": "hi"}')))
    server.expect_ordered_request(endpoint).respond_with_json(reply(call("k3", "final_answer", '{"done": true}')))
    run_id = fleet.submit({"agent": "wired", "input": {"word": "hi"}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded", result
    requests = sent(server)
    assert len(requests) == 4 and requests[0] == requests[1]  # the 429's request, sent again unchanged
    repaired = requests[2]["messages"]
    assert repaired[-3]["tool_calls"][0]["id"] == "k1"
    told = json.loads(repaired[-2]["content"])
    assert repaired[-2]["tool_call_id"] == "k1" and told["error_code"] == ErrorCode.INVALID_ARGUMENTS
    assert "not JSON" in told["message"] and repaired[-1]["role"] == "user"
    echoed = requests[3]["messages"][-1]
    assert echoed["tool_call_id"] == "k2" and json.loads(echoed["content"])["output"]["text"] == "hi"
    usage = result["usage"]
    assert usage["steps"] == 3 and usage["input_tokens"] == 600 and usage["output_tokens"] == 60
    assert usage["cost_usd"] == pytest.approx(3 * (200 * 0.4 + 20 * 1.6) / 1e6) and not usage["unpriced"]


def test_a_provider_that_stays_down_fails_the_run_with_model_error_naming_its_status(
        fleet: EmbeddedFleet, server: HTTPServer) -> None:
    server.expect_request("/v1/chat/completions").respond_with_json(
        {"error": {"message": "upstream overloaded"}}, status=503, headers={"retry-after": "0"})
    run_id = fleet.submit({"agent": "wired", "input": {}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["error_code"] == ErrorCode.MODEL_ERROR
    assert "503 upstream overloaded" in result["message"] and "status.openai.com" in result["message"]
    assert result["recovery_suggestion"]
    assert len(server.log) == 4  # AGENTFLEET_MODEL_RETRY_ATTEMPTS tries in all, from one layer


def test_bad_credentials_fail_once_with_their_own_code(fleet: EmbeddedFleet, server: HTTPServer) -> None:
    server.expect_request("/v1/chat/completions").respond_with_json({"error": {"message": "bad key"}}, status=401)
    run_id = fleet.submit({"agent": "wired", "input": {}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["error_code"] == ErrorCode.MODEL_AUTH and len(server.log) == 1


def test_the_override_leaves_the_declared_agent_alone(fleet: EmbeddedFleet) -> None:
    from agentfleet.agents.registry import registry
    from agentfleet.models import ScriptedModel

    assert isinstance(registry.get("wired").model, ScriptedModel)  # type: ignore[union-attr]


def test_a_wrong_agent_name_in_the_models_setting_is_refused(tmp_path: Path) -> None:
    from agentfleet.agents.registry import load_agents
    from agentfleet.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="wird"):
        load_agents(["tests.fixtures.agents"], {"wird": "openai:gpt-4.1-mini"})


def test_a_small_context_window_compacts_old_tool_results_in_the_request_and_records_it(
        fleet: EmbeddedFleet, server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentfleet import ContextBudget

    model = fleet.runtime.agent("wired").model  # type: ignore[union-attr]
    monkeypatch.setattr(model, "context_window", 3200)
    monkeypatch.setattr(fleet.runtime.agent("wired"), "context", ContextBudget(parts={"recent": 1200}))
    endpoint = "/v1/chat/completions"
    big = json.dumps({"text": "word " * 300})
    server.expect_ordered_request(endpoint).respond_with_json(reply(call("e1", "slow_echo", big)))
    server.expect_ordered_request(endpoint).respond_with_json(reply(call("e2", "slow_echo", '{"text": "x"}')))
    server.expect_ordered_request(endpoint).respond_with_json(reply(call("e3", "final_answer", '{"done": true}')))
    run_id = fleet.submit({"agent": "wired", "input": {}})
    assert wait_for_run(fleet.store, run_id, timeout=30).result["status"] == "succeeded"  # type: ignore[index]
    last = sent(server)[2]["messages"]
    first_result = json.loads(next(m for m in last if m.get("tool_call_id") == "e1")["content"])
    assert first_result["compacted"] is True and first_result["ref"] == "result:e1"
    assert "read_artifact" in [t["function"]["name"] for t in sent(server)[2]["tools"]]  # to read it back
    plans = [s for s in fleet.store.steps(run_id) if s["kind"] == "plan"]
    assert plans[2]["output"]["context"]["compacted"] == {"results": 1}
    assert set(plans[2]["output"]["context"]["tokens"]) == {"instructions", "tools", "task", "observations",
                                                            "summary", "recent"}
