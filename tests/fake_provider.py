"""A local server that answers OpenAI Chat Completions like a small, diligent model of word_stats: it calls
both tools on the goal's text, then answers from what they returned. For tests of the adapter, recording and
the README's guide."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response


@pytest.fixture
def word_stats_server() -> Iterator[HTTPServer]:
    """A local server answering Chat Completions as ``word_stats_model`` does."""
    with HTTPServer(host="127.0.0.1", port=0) as running:
        running.expect_request("/v1/chat/completions").respond_with_handler(word_stats_model)
        yield running


def word_stats_model(request: Request) -> Response:
    body = json.loads(request.get_data())
    messages = body["messages"]
    at = max(i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].startswith('{"goal"'))
    # after the agent's worked example: this run's goal, and what its tools returned
    results = {m["tool_call_id"]: json.loads(m["content"]) for m in messages[at:] if m["role"] == "tool"}
    if not results:
        goal = json.loads(messages[at]["content"])["goal"]
        args = json.dumps({"text": goal["text"]})
        calls = [_call("w1", "count_words", args), _call("w2", "longest_word", args)]
    else:
        answer = {"words": results["w1"]["output"]["words"], "longest": results["w2"]["output"]["word"]}
        calls = [_call("w3", "final_answer", json.dumps(answer))]
    reply = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": body["model"],
             "choices": [{"index": 0, "finish_reason": "tool_calls",
                          "message": {"role": "assistant", "content": "", "tool_calls": calls}}],
             "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}}
    return Response(json.dumps(reply), content_type="application/json")


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
