"""Opt-in (``make test-local-model``; ``AGENTFLEET_LOCAL_MODEL_TESTS=1``): the bundled agents finish their jobs on a
real model on this CPU, Qwen2.5-Coder-1.5B behind llama-server, built and assembled by ``make demo-local-model``.
About twenty minutes on 2 cores (both adapters); not part of ``make test``, whose suite must stay under 15 minutes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfleet.testing.local_model import QWEN25_CODER_1_5B, LlamaServer, ensure_model, have_binary, server_binary

pytestmark = [
    pytest.mark.local_model,
    pytest.mark.skipif(os.environ.get("AGENTFLEET_LOCAL_MODEL_TESTS") != "1",
                       reason="opt-in: make test-local-model (AGENTFLEET_LOCAL_MODEL_TESTS=1)"),
]
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if not have_binary():
        pytest.fail("no llama-server build: run `make demo-local-model` once (it builds and caches it)")
    import demo_local_model as demo

    with LlamaServer(server_binary(), QWEN25_CODER_1_5B, ensure_model(QWEN25_CODER_1_5B), context=demo.CONTEXT,
                     log_path=tmp_path_factory.mktemp("llama") / "server.log") as running:
        yield running


ADAPTERS = ["openai-compatible", "anthropic-compatible"]


def model_for(server: LlamaServer, adapter: str):  # type: ignore[no-untyped-def]
    import demo_local_model as demo

    return dict(demo.models(server.base, "qwen2.5-coder-1.5b"))[adapter]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_word_stats_finishes_with_the_right_answer_in_at_least_eight_of_ten_runs(
        server: LlamaServer, tmp_path: Path, adapter: str) -> None:
    import demo_local_model as demo

    model = model_for(server, adapter)
    report = demo.word_stats(model, 10, tmp_path)
    assert report["right_answers"] >= 8, report


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_support_tree_succeeds_end_to_end(server: LlamaServer, tmp_path: Path, adapter: str) -> None:
    import demo_local_model as demo

    model = model_for(server, adapter)
    report = demo.support(model, tmp_path)
    assert report["succeeded"] == report["runs"] == 2, report
