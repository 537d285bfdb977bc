"""The hook list a process runs with, from settings: the audit log, metrics, tracing, then the user's own hooks."""

from __future__ import annotations

import importlib

from agentfleet.config.settings import Settings
from agentfleet.errors import ConfigurationError
from agentfleet.hooks.base import Hook, Hooks


def hook_targets(spec: str) -> list[type[Hook] | Hook]:
    """``module:attr`` entries, comma-separated, each a Hook subclass or a Hook instance: imported and checked,
    not made (the worker's preflight checks them; the runtime makes each once)."""
    found: list[type[Hook] | Hook] = []
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
        if not (isinstance(target, Hook) or (isinstance(target, type) and issubclass(target, Hook))):
            raise ConfigurationError(f"AGENTFLEET_HOOKS entry {entry!r} is not a Hook subclass or instance "
                                     "(agentfleet.hooks.Hook)")
        found.append(target)
    return found


def user_hooks(spec: str) -> list[Hook]:
    """The hooks ``spec`` names: a subclass is made with no arguments, an instance used as it is."""
    return [target() if isinstance(target, type) else target for target in hook_targets(spec)]


def build_hooks(settings: Settings) -> Hooks:
    hooks: list[Hook] = []
    if settings.audit_log:
        from agentfleet.hooks.audit import AuditHook

        hooks.append(AuditHook(log_path=settings.audit_log))
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
