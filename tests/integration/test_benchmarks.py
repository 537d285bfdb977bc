"""The benchmark code runs (on a tiny size). Figures are printed by `agentfleet bench`, never asserted here."""

from __future__ import annotations

import pytest

from tests.conftest import require


@pytest.mark.parametrize("suite", ["overhead", "growth", "recovery"])
def test_each_benchmark_suite_runs_on_a_tiny_size(suite: str) -> None:
    require("rabbitmq", "postgres", "redis")
    from benchmarks import run as bench

    report = bench.run([suite], bench.Sizes.tiny())
    assert report.figures["machine"]["cores"]
    figures = report.figures[suite]
    assert figures and all(v is not None for v in figures.values())
    if suite == "growth":
        assert figures["iterations"] == bench.Sizes.tiny().growth_iterations
    if suite == "recovery":
        assert figures["kills"] == 1
