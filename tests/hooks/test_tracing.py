"""OpenTelemetry spans from the tracing hook: one trace per run, across roles (issue 13)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentfleet.hooks.tracing import trace_id_of
from agentfleet.workers.embedded import EmbeddedFleet
from tests.fixtures.hooks import traced
from tests.helpers import embedded_fleet, eventually, wait_for_run


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("ws"), "tests.fixtures.agents",
                        AGENTFLEET_HOOKS="tests.fixtures.hooks:traced") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def test_a_run_is_one_trace_with_a_span_per_step_tool_call_and_model_call(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "ledger", "input": {}})
    run = wait_for_run(fleet.store, run_id)
    assert run.result is not None and run.result["status"] == "succeeded"
    exporter = traced.exporter

    def spans() -> list:
        mine = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id_of(run.trace_id)]
        # complete once the observer has handled the seven tool results and the run's end
        return mine if sum(1 for s in mine if s.name.startswith("observer")) >= 8 else []

    mine = eventually(spans, timeout=10, message="the run's spans")
    names = [s.name for s in mine]
    assert names.count("tool append_ledger") == 4 and names.count("tool slow_echo") == 3
    assert names.count("model scripted") == 3
    assert names.count("planner goal.submitted") == 1 and names.count("executor tool.requested") == 7
    by_id = {s.context.span_id: s for s in mine}
    for span in mine:
        if span.name.startswith("tool "):  # inside the executor step that ran it
            assert by_id[span.parent.span_id].name == "executor tool.requested"
        elif span.name.startswith("model "):
            assert by_id[span.parent.span_id].name.startswith("planner ")
            assert span.attributes["gen_ai.usage.output_tokens"] == 10
        else:  # a step: a root of the run's trace
            assert span.parent is None and span.attributes["agentfleet.run_id"] == run_id
    assert {s.attributes.get("agentfleet.outcome") for s in mine if s.parent is None} == {"published"}


def test_a_trace_id_that_is_not_hex_still_makes_a_valid_one() -> None:
    assert trace_id_of("0" * 31 + "1") == 1
    assert 0 < trace_id_of("not-a-hex-trace-id") < 2**128
    assert trace_id_of("x") == trace_id_of("x")


def test_the_exporter_setting_turns_tracing_on_and_a_wrong_one_stops_the_start() -> None:
    from agentfleet.config.settings import Settings
    from agentfleet.errors import ConfigurationError
    from agentfleet.hooks.loading import build_hooks
    from agentfleet.hooks.tracing import TracingHook

    assert build_hooks(Settings(otel_exporter="", hooks="")).find(TracingHook) is None
    assert build_hooks(Settings(otel_exporter="console", hooks="")).find(TracingHook) is not None
    with pytest.raises(ConfigurationError, match="use otlp or console"):
        build_hooks(Settings(otel_exporter="jaeger", hooks=""))
