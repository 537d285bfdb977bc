"""A context that always fits, on an embedded fleet: a 100-iteration run of ~2,000-token tool results on a 4,096
token window finishes and still reaches what it read first; a task too large for its budget ends with a code."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from agentfleet.errors import ErrorCode
from agentfleet.workers.embedded import EmbeddedFleet
from tests.fixtures.context_agents import PAGES, SECRET
from tests.helpers import embedded_fleet, wait_for_run


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("ws"), "tests.fixtures.context_agents") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def test_a_hundred_iterations_of_large_results_on_a_small_window_finish_and_reach_the_first_fact(
        fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "long_reader", "input": {}})
    run = wait_for_run(fleet.store, run_id, timeout=240)
    assert run.result is not None and run.result["status"] == "succeeded", run.result
    assert run.result["output"] == {"done": True, "seen": [SECRET], "how": "read back"}
    plans = sorted((s for s in fleet.store.steps(run_id) if s["kind"] == "plan"), key=lambda s: s["iteration"])
    assert len(plans) == PAGES + 2
    reports = [p["output"]["context"] for p in plans]
    assert all(r["total"] <= r["prompt"] == 4096 - 512 for r in reports)
    assert all(r["tokens"]["observations"] > 1500 for r in reports[1:PAGES])  # the latest page, whole, each turn
    assert reports[-1]["compacted"]["turns"] > 90 and reports[-1]["compacted"]["omitted"] > 0
    # What each iteration stores stays flat as the run grows (the transcript once, a bounded report per turn).
    sizes = [len(json.dumps(p["output"])) for p in plans]
    assert max(sizes[PAGES - 10: PAGES]) <= 1.2 * max(sizes[10:20])
    read_back = next(s for s in fleet.store.steps(run_id) if s["kind"] == "tool" and s["iteration"] == PAGES)
    assert read_back["output"]["output"]["ref"] == "result:p0" and SECRET in read_back["output"]["output"]["text"]


def test_a_result_reference_reads_only_the_runs_own_results(fleet: EmbeddedFleet) -> None:
    runs = [fleet.submit({"agent": "long_reader", "input": {}, "limits": {"max_steps": 3}}) for _ in range(2)]
    for run_id in runs:
        wait_for_run(fleet.store, run_id, timeout=60)
    mine = fleet.store.artifact_part(runs[0], "result:p0", 0, 10_000)
    assert mine is not None and SECRET in mine[0].decode()
    assert fleet.store.artifact_part(runs[0], "result:nope", 0, 10) is None
    assert fleet.store.artifact_part("another-run", "result:p0", 0, 10) is None


def test_a_task_larger_than_its_budget_ends_context_budget_exceeded_naming_it(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "overfed", "input": {"text": "word " * 4000}})
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "failed"
    assert result["error_code"] == ErrorCode.CONTEXT_BUDGET_EXCEEDED
    assert "the task (goal and constraints)" in result["message"] and "window 2048" in result["message"]
    assert "give the agent a larger ContextBudget" in result["recovery_suggestion"]


def test_the_trace_shows_each_model_calls_context_by_part_and_what_was_compacted(fleet: EmbeddedFleet) -> None:
    from agentfleet.ops.trace import trace_lines, trace_of

    run_id = fleet.submit({"agent": "long_reader", "input": {}, "limits": {"max_steps": 4}})
    wait_for_run(fleet.store, run_id, timeout=60)
    lines = [line for line in trace_lines(trace_of(fleet.store, run_id) or {}) if "context:" in line]
    assert len(lines) == 4 and all("of 3584 tokens (instructions" in line for line in lines)
    assert "observations" in lines[1] and "compacted 1 old results to references" in lines[2]


def test_a_summary_model_keeps_the_running_summary_incrementally_and_its_cost_counts(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "summarized_reader", "input": {}})
    run = wait_for_run(fleet.store, run_id, timeout=60)
    assert run.result is not None and run.result["output"] == {"done": True, "seen": [SECRET], "how": "summary"}
    reports = [p["output"]["context"] for p in sorted((s for s in fleet.store.steps(run_id) if s["kind"] == "plan"),
                                                       key=lambda s: s["iteration"])]
    summaries = [r["summary"] for r in reports if "summary" in r]
    assert summaries and all(s["text"] == f"vault code is {SECRET}" for s in summaries)
    covered = [s["turns"] for s in summaries]
    assert covered == sorted(covered) and covered[-1] > covered[0]  # it grew with the run, from what was recorded
    assert all(r["compacted"]["summarized"] == r["summary"]["turns"] for r in reports if "summary" in r)
    assert run.input_tokens > 10 * len(reports)  # 10 a turn, and the summary model's prompts with their turns


def test_a_summary_model_that_fails_leaves_the_lines_in_its_place(fleet: EmbeddedFleet) -> None:
    """The extractive lines are the fallback: the run goes on, and the first page's line still holds its fact."""
    run_id = fleet.submit({"agent": "unsummarized_reader", "input": {}})
    run = wait_for_run(fleet.store, run_id, timeout=60)
    assert run.result is not None and run.result["status"] == "succeeded", run.result
    reports = [p["output"]["context"] for p in fleet.store.steps(run_id) if p["kind"] == "plan"]
    assert not any("summary" in r for r in reports) and any(r.get("compacted", {}).get("turns") for r in reports)
    assert run.result["output"] == {"done": True, "seen": [SECRET], "how": "summary"}  # page 0's line holds it


@pytest.mark.parametrize("stored", [None, "text", {"context": None}, {"context": {"summary": {"turns": "3"}}},
                                    {"context": {"summary": {"turns": 0, "text": "x"}}},
                                    {"context": {"summary": {"turns": 2, "text": "  "}}}, [1, 2]])
def test_a_recorded_summary_is_read_strictly(stored: object) -> None:
    from agentfleet.roles.prompt import recorded_summary

    assert recorded_summary(stored) is None
    assert recorded_summary({"context": {"summary": {"turns": 2, "text": "ok"}}}) == (2, "ok")


def test_a_prompt_the_tokenizer_counts_over_is_assembled_again_and_counted_again_until_it_fits() -> None:
    """The exact-count path: over, scaled, assembled and counted again (at most EXACT_RECOUNTS times)."""
    from agentfleet.context import Overflow
    from agentfleet.context.counting import Heuristic
    from agentfleet.fleet.gate import Offer
    from agentfleet.loop.budgets import Limits
    from agentfleet.loop.states import RunState
    from agentfleet.loop.transcript import History, Message, ToolCall
    from agentfleet.roles.prompt import EXACT_RECOUNTS, prompt_for
    from agentfleet.store.records import RunRecord
    from tests.fixtures.context_agents import long_reader, page

    counts: list[int] = []
    factors = [1.1, 1.2, 1.2]  # the model's tokenizer over the heuristic by this much, call by call

    class Tokenizer:  # over the prompt on the first two counts, within it on the third
        name, offline, context_window, max_output_tokens = "t", True, 4096, 512

        def count_tokens(self, messages: list[Message], tools: list[dict]) -> int:
            raw = Heuristic().messages(messages) + Heuristic().tools(tools)
            counts.append(int(raw * factors[len(counts)]))
            return counts[-1]

    agent = copy.copy(long_reader)
    agent.model = Tokenizer()  # type: ignore[assignment]
    ts = datetime.now(UTC)
    run = RunRecord("r", "long_reader", "g", "t", RunState.PLANNING, 1, 0, {}, {}, 0, 0, 0, 0.0, None, None, ts, ts)
    pages = [m for n in range(40) for m in (
        Message(role="assistant", tool_calls=[ToolCall(id=f"p{n}", name="page", arguments={"n": n})]),
        Message(role="tool", tool_call_id=f"p{n}", content=json.dumps({"ok": True, "output": page(n)["text"][:1000]})))]
    built = prompt_for(agent, run, Limits(), 40, History.of(pages), Offer(["page"], None))
    assert not isinstance(built, Overflow), built
    assert len(counts) == EXACT_RECOUNTS + 1 and counts[:-1] > [3584] * EXACT_RECOUNTS  # over, over, then within
    assert built.report["exact"] == counts[-1] <= 3584
