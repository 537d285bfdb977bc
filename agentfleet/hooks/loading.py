"""The hook list a process runs with, from settings: the audit trail, metrics, then the user's own hooks."""

from __future__ import annotations

import importlib

from agentfleet.config.settings import Settings
from agentfleet.errors import ConfigurationError
from agentfleet.hooks.base import Hook, Hooks


def user_hooks(spec: str) -> list[Hook]:
    """``module:attr`` entries, comma-separated: a Hook subclass (made with no arguments) or a Hook instance."""
    found: list[Hook] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        module_name, _, attr = entry.partition(":")
        if not attr:
            raise ConfigurationError(f"AGENTFLEET_HOOKS entry {entry!r} is not module:attribute")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(f"AGENTFLEET_HOOKS entry {entry!r} cannot be loaded: {exc}") from exc
        hook = target() if isinstance(target, type) and issubclass(target, Hook) else target
        if not isinstance(hook, Hook):
            raise ConfigurationError(f"AGENTFLEET_HOOKS entry {entry!r} is not a Hook subclass or instance "
                                     "(agentfleet.hooks.Hook)")
        found.append(hook)
    return found


def build_hooks(settings: Settings) -> Hooks:
    hooks: list[Hook] = []
    if settings.audit or settings.audit_log:
        from agentfleet.hooks.audit import AuditHook

        hooks.append(AuditHook(table=settings.audit, log_path=settings.audit_log))
    if settings.metrics_port is not None:
        from agentfleet.hooks.metrics import PrometheusHook

        hooks.append(PrometheusHook())
    if settings.otel_exporter:
        try:
            from agentfleet.hooks.tracing import TracingHook
        except ImportError as exc:
            raise ConfigurationError("AGENTFLEET_OTEL_EXPORTER needs OpenTelemetry: pip install 'agentfleet[otel]'"
                                     ) from exc
        hooks.append(TracingHook(settings.otel_exporter))
    return Hooks([*hooks, *user_hooks(settings.hooks)])
