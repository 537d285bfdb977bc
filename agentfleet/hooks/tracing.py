"""OpenTelemetry spans as a hook: one trace per run, a span per step, tool call and model call.

A run's steps happen in different processes with nothing passed between them but
events, and every event already carries the run's ``trace_id`` (32 hex digits, an
OpenTelemetry trace id's size). So no context is propagated: each step span is
started with that trace id (an id generator that hands it out), and every process's
spans of one run land in one trace. Tool and model spans are children of the step
span they ran in. On only when an exporter is configured (``AGENTFLEET_OTEL_EXPORTER``:
``otlp``, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables, or
``console``), or when a hook of this class is given its own exporter.
"""

from __future__ import annotations

import hashlib
import random
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Status, StatusCode

from agentfleet.errors import ConfigurationError
from agentfleet.hooks.base import Hook, ModelCallInfo, StepInfo, ToolCallInfo

if TYPE_CHECKING:
    from agentfleet.loop.transcript import ModelTurn, ToolResult


def trace_id_of(run_trace_id: str) -> int:
    """The OpenTelemetry trace id of a run: its ``trace_id`` when that is 32 hex digits, else a hash of it."""
    try:
        value = int(run_trace_id, 16) if len(run_trace_id) == 32 else 0
    except ValueError:
        value = 0
    return value or int(hashlib.sha256(run_trace_id.encode()).hexdigest()[:32], 16)


class _RunTraceIds(IdGenerator):
    """New root spans get the trace id of the run this thread is handling; span ids are random."""

    def __init__(self) -> None:
        self.wanted = threading.local()

    def generate_span_id(self) -> int:
        return random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return getattr(self.wanted, "trace_id", None) or random.getrandbits(128) or 1


def exporter_named(name: str) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigurationError("AGENTFLEET_OTEL_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http "
                                     "(pip install 'agentfleet[otel]')") from exc
        return OTLPSpanExporter()
    raise ConfigurationError(f"AGENTFLEET_OTEL_EXPORTER={name!r}: use otlp or console")


class TracingHook(Hook):
    def __init__(self, exporter: SpanExporter | str = "otlp", *, batch: bool = True,
                 service_name: str = "agentfleet") -> None:
        self.exporter = exporter_named(exporter) if isinstance(exporter, str) else exporter
        self.ids = _RunTraceIds()
        self.provider = TracerProvider(id_generator=self.ids, resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter) if batch
                                         else SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("agentfleet")
        # This thread's open spans, innermost last: (key, span, context token). The provider flushes its
        # batch at interpreter exit (its default), so a stopping worker loses no span.
        self._open = threading.local()

    def _stack(self) -> list[tuple[tuple[str, str], Any, object]]:
        if not hasattr(self._open, "spans"):
            self._open.spans = []
        return self._open.spans  # type: ignore[no-any-return]

    def _start(self, key: tuple[str, str], name: str, attributes: dict[str, Any]) -> None:
        span = self.tracer.start_span(name, attributes={k: v for k, v in attributes.items() if v is not None})
        self._stack().append((key, span, otel_context.attach(trace.set_span_in_context(span))))

    def _end(self, key: tuple[str, str], error: BaseException | None = None, failed: str | None = None,
             **attributes: Any) -> None:
        """End the span opened under ``key``, and any left open inside it (a step that raised mid-call)."""
        stack = self._stack()
        if not any(k == key for k, _, _ in stack):
            return  # never opened in this process (a result carried over from an earlier attempt)
        while stack:
            k, span, token = stack.pop()
            otel_context.detach(token)  # type: ignore[arg-type]
            if k != key:
                span.set_status(Status(StatusCode.ERROR, "left open when its step ended"))
                span.end()
                continue
            for name, value in attributes.items():
                if value is not None:
                    span.set_attribute(name, value)
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            elif failed is not None:
                span.set_status(Status(StatusCode.ERROR, failed))
            span.end()
            return

    def before_step(self, step: StepInfo) -> None:
        self.ids.wanted.trace_id = trace_id_of(step.trace_id)
        try:
            self._start(("step", step.event_id), f"{step.role} {step.event_type}", {
                "agentfleet.run_id": step.run_id, "agentfleet.event_id": step.event_id,
                "agentfleet.role": step.role, "agentfleet.worker": step.worker,
                "agentfleet.redelivered": step.redelivered})
        finally:
            self.ids.wanted.trace_id = None

    def after_step(self, step: StepInfo, outcome: str, error: BaseException | None, duration_s: float) -> None:
        self._end(("step", step.event_id), error if outcome == "error" else None, **{"agentfleet.outcome": outcome})

    def before_tool(self, call: ToolCallInfo) -> None:
        self._start(("tool", call.call_id), f"tool {call.tool}",
                    {"agentfleet.call_id": call.call_id, "agentfleet.tool": call.tool,
                     "agentfleet.attempt": call.attempt})

    def after_tool(self, call: ToolCallInfo, result: ToolResult) -> None:
        if not call.ran:  # answered without running (a denial, an unknown tool): an event on the step span
            trace.get_current_span().add_event(f"tool {call.tool} answered without running",
                                               {"agentfleet.error_code": str(result.error_code)})
            return
        self._end(("tool", call.call_id), failed=str(result.error_code) if not result.ok else None,
                  **{"agentfleet.error_code": str(result.error_code) if result.error_code else None})

    def before_model(self, call: ModelCallInfo) -> None:
        self._start(("model", call.run_id), f"model {call.model}",
                    {"gen_ai.request.model": call.model, "agentfleet.iteration": call.iteration})

    def after_model(self, call: ModelCallInfo, turn: ModelTurn | None, error: BaseException | None,
                    duration_s: float) -> None:
        usage = turn.usage if turn is not None else None
        self._end(("model", call.run_id), error, **{"gen_ai.usage.input_tokens": usage.input_tokens if usage else None,
                            "gen_ai.usage.output_tokens": usage.output_tokens if usage else None,
                            "agentfleet.cost_usd": usage.cost_usd if usage else None})
