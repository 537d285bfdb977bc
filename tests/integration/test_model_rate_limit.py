"""Two planner processes share one rate limit through Redis: together they never exceed it (issue 8)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from agentfleet import constants as C
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient

PER_SECOND = 2


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    with HTTPServer(host="127.0.0.1", port=0, threaded=True) as running:
        yield running


def test_two_planners_together_keep_to_the_fleet_wide_request_limit(workers: WorkerProcs, server: HTTPServer,
                                                                    fleet_redis: object) -> None:
    arrived: list[float] = []
    lock = threading.Lock()

    def answer(_: Request) -> Response:
        with lock:
            arrived.append(time.time())
        body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "", "tool_calls": [
                        {"id": "f", "type": "function",
                         "function": {"name": "final_answer", "arguments": '{"done": true}'}}]}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        return Response(json.dumps(body), content_type="application/json")

    server.expect_request("/v1/chat/completions").respond_with_handler(answer)
    workers.env["AGENTFLEET_MODELS"] = json.dumps({"wired": f"openai-compatible:{server.url_for('/v1')}:m"})
    workers.env["AGENTFLEET_MODEL_RATE_LIMITS"] = json.dumps({"m": {"requests": f"{PER_SECOND}/second"}})
    workers.start(C.PLANNER, "--concurrency", "4")
    workers.start(C.PLANNER, "--concurrency", "4")
    workers.start(C.OBSERVER)
    workers.start(C.EXECUTOR)
    workers.wait_ready()
    client = AmqpClient()
    runs = 12
    for _ in range(runs):
        client.publish_goal(workers.env["AGENTFLEET_NAMESPACE"], "goal.wired", {"agent": "wired", "input": {}})
    replies = client.replies(runs, timeout=90)
    assert [r["status"] for r in replies.values()] == ["succeeded"] * runs
    assert len(arrived) == runs
    arrived.sort()
    # Any PER_SECOND + 1 requests span at least a second (less the HTTP hop's jitter).
    spans = [arrived[i + PER_SECOND] - arrived[i] for i in range(len(arrived) - PER_SECOND)]
    assert min(spans) >= 0.9, spans
    assert workers.logged("at its rate limit")  # the planners did wait on each other
    client.close()
