"""Prometheus metrics as a hook (like Dramatiq's ``middleware/prometheus.py``), served by each worker.

Every series is counted where it happens, once: a step by the worker that handled
it, a tool result by the executor that produced it (a redelivered call whose
result was stored is not counted again), a model call by the planner that made it,
a run's start and end after the transition committed. The registry is the hook's
own, not prometheus-client's global one, so two fleets in one process (tests,
embedded) never add to each other's counters. Queue depths are read from the
broker when scraped.

Under ``--pool prefork`` tasks run in child processes: ``agentfleet worker`` then
turns on prometheus-client's multiprocess mode (``metrics_dir.py``), every process
writes its values to a directory, and the parent's endpoint serves their sum.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from agentfleet.hooks.base import Hook, ModelCallInfo, StepInfo, ToolCallInfo, Transition
from agentfleet.hooks.metrics_dir import multiprocess
from agentfleet.loop.states import RunState, is_terminal

if TYPE_CHECKING:
    from agentfleet.loop.transcript import ModelTurn, ToolResult

log = logging.getLogger(__name__)

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _QueueDepths(Collector):
    """Messages ready per role queue, asked of the broker at scrape time (none when it cannot be asked)."""

    def __init__(self, read: Callable[[], dict[str, int]] | None) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("agentfleet_queue_depth", "Messages ready in each role's queue", labels=["role"])
        for role, depth in (self.read() if self.read else {}).items():
            family.add_metric([role], depth)
        yield family


class PrometheusHook(Hook):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter("agentfleet_events_handled", "Events handled, by role, event type and outcome",
                              ["role", "event", "outcome"], registry=r)
        self.step_seconds = Histogram("agentfleet_step_duration_seconds", "Time to handle one event",
                                      ["role", "event"], buckets=SECONDS, registry=r)
        self.tool_calls = Counter("agentfleet_tool_calls", "Tool call results by tool and error code (ok: none)",
                                  ["tool", "code"], registry=r)
        self.tool_seconds = Histogram("agentfleet_tool_duration_seconds", "Time a tool ran", ["tool"],
                                      buckets=SECONDS, registry=r)
        self.model_calls = Counter("agentfleet_model_calls", "Requests to a model by outcome (ok, error)",
                                   ["model", "outcome"], registry=r)
        self.model_seconds = Histogram("agentfleet_model_duration_seconds", "Time a model took to answer",
                                       ["model"], buckets=SECONDS, registry=r)
        self.model_tokens = Counter("agentfleet_model_tokens", "Tokens by model and kind (input, output)",
                                    ["model", "kind"], registry=r)
        self.model_cost = Counter("agentfleet_model_cost_usd", "Cost of model calls in US dollars", ["model"],
                                  registry=r)
        self.runs_started = Counter("agentfleet_runs_started", "Runs that began planning", ["agent"], registry=r)
        self.runs_ended = Counter("agentfleet_runs_ended", "Runs ended, by final state and error code (none: "
                                  "succeeded)", ["agent", "state", "reason"], registry=r)
        self.depths = _QueueDepths(None)
        r.register(self.depths)
        self._served: tuple[str, int] | None = None
        self._serving = threading.Lock()

    def read_queue_depths(self, read: Callable[[], dict[str, int]]) -> None:
        self.depths.read = read

    def serve(self, port: int, addr: str) -> tuple[str, int]:
        """Start the scrape endpoint once per process (an embedded fleet's three workers share it)."""
        with self._serving:
            if self._served is None:
                registry = self.registry
                if multiprocess():  # prefork: sum what every child wrote, and ask the broker for depths here
                    registry = CollectorRegistry()
                    MultiProcessCollector(registry)
                    registry.register(self.depths)
                server, _ = start_http_server(port, addr=addr, registry=registry)
                self._served = (addr, int(server.server_address[1]))
                log.info("metrics served", extra={"addr": addr, "port": self._served[1]})
            return self._served

    def after_step(self, step: StepInfo, outcome: str, error: BaseException | None, duration_s: float) -> None:
        self.events.labels(step.role, step.event_type, outcome).inc()
        self.step_seconds.labels(step.role, step.event_type).observe(duration_s)

    def after_tool(self, call: ToolCallInfo, result: ToolResult) -> None:
        self.tool_calls.labels(call.tool, "ok" if result.ok else str(result.error_code)).inc()
        if call.ran:
            self.tool_seconds.labels(call.tool).observe(result.duration_ms / 1000)

    def after_model(self, call: ModelCallInfo, turn: ModelTurn | None, error: BaseException | None,
                    duration_s: float) -> None:
        self.model_calls.labels(call.model, "ok" if turn is not None else "error").inc()
        self.model_seconds.labels(call.model).observe(duration_s)
        if turn is not None:
            self.model_tokens.labels(call.model, "input").inc(turn.usage.input_tokens)
            self.model_tokens.labels(call.model, "output").inc(turn.usage.output_tokens)
            self.model_cost.labels(call.model).inc(turn.usage.cost_usd)

    def after_transition(self, change: Transition) -> None:
        if change.from_state == RunState.PENDING:
            self.runs_started.labels(change.agent).inc()
        if is_terminal(RunState(change.to_state)):
            self.runs_ended.labels(change.agent, str(change.to_state), change.error_code or "").inc()
