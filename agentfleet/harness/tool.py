"""``@tool``: a typed Python function becomes a declared capability with a JSON Schema.

Arguments are validated by a pydantic model built from the signature, so the
schema the model sees and the validation the executor applies are one thing.
A parameter annotated ``ToolContext`` is injected, never shown to the model.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agentfleet.config.settings import Settings
from agentfleet.constants import DEFAULT_TOOL_RESPONSE_LIMIT
from agentfleet.errors import ConfigurationError, ErrorCode, ToolError
from agentfleet.harness.health import TIERS, HealthCheck, Tier, as_health_check
from agentfleet.harness.policy import RequiresApproval
from agentfleet.harness.workspace import Workspace


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about the step it serves."""

    run_id: str
    call_id: str
    idempotency_key: str  # pass it to outside systems (payment APIs, ticketing) that dedupe
    workspace: Path
    attempt: int = 1

    @property
    def files(self) -> Workspace:
        """Open and walk files beneath the workspace without following links (safe against swaps)."""
        return Workspace(self.workspace)

    def resolve(self, relative: str) -> Path:
        """A path inside the workspace, to name or show; open files with ``files`` (checked, then opened
        by name, a path can be swapped for a link in between)."""
        candidate = (self.workspace / relative).resolve()
        if candidate != self.workspace and self.workspace not in candidate.parents:
            raise ToolError(
                f"path {relative!r} is outside the workspace",
                code=ErrorCode.PERMISSION_DENIED,
                hint="Use a path relative to the workspace root, without '..'.",
            )
        return candidate


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    func: Callable[..., Any]
    args_model: type[BaseModel]
    context_param: str | None = None
    timeout_s: float | None = None
    tier: Tier | None = None
    idempotent: bool = False
    read_only: bool = False
    cache_ttl_s: float | None = None  # read-only tools: how long a result is reused (None: the fleet default)
    health_check: HealthCheck | None = None
    fallback: str | None = None  # offered in this tool's place while it is down
    lock: str | None = None  # a resource lock template over the arguments, e.g. "ticket:{ticket_id}"
    response_limit: int = DEFAULT_TOOL_RESPONSE_LIMIT
    parameters: dict[str, Any] = field(default_factory=dict)
    requires_approval: RequiresApproval = False  # True, or a function of the arguments
    approval_expires_s: float | None = None  # an unanswered request is denied after this (None: never)

    def default_timeout_s(self, settings: Settings) -> float:
        """The timeout when the tool sets none of its own: its tier's, else the fleet's default."""
        return settings.tier_timeout_s(self.tier) if self.tier else settings.tool_timeout_s

    def effective_timeout_s(self, settings: Settings) -> float:
        return self.timeout_s or self.default_timeout_s(settings)

    def lock_key(self, kwargs: dict[str, Any]) -> str | None:
        """The resource this call holds while it runs, from its validated arguments."""
        return self.lock.format_map(kwargs) if self.lock else None

    def spec(self) -> dict[str, Any]:
        """The declaration a model sees (OpenAI-style function tool)."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments, or INVALID_ARGUMENTS with the schema's complaints."""
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:10]
            )
            raise ToolError(
                f"arguments for {self.name} are invalid: {problems}",
                code=ErrorCode.INVALID_ARGUMENTS,
                hint=f"Call {self.name} with arguments matching its JSON Schema.",
            ) from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    tier: Tier | None = None,
    idempotent: bool = False,
    read_only: bool = False,
    cache_ttl_s: float | None = None,
    health_check: object = None,
    fallback: str | None = None,
    lock: str | None = None,
    response_limit: int = DEFAULT_TOOL_RESPONSE_LIMIT,
    requires_approval: RequiresApproval = False,
    approval_expires_s: float | None = None,
    **unknown: Any,
) -> Any:
    """Declare a tool. Usable bare (``@tool``) or with options (``@tool(idempotent=True)``).

    ``tier`` (``model``, ``database``, ``http``, ``local``) sets the timeout by what the tool calls;
    ``timeout_s`` overrides it. ``health_check`` (a function, a command line, or a shared check's
    name) decides fleet-wide whether the tool is offered; ``fallback`` names the agent's tool
    offered in its place while it is down. ``read_only`` tools are idempotent and their results are
    cached for ``cache_ttl_s``. ``lock`` is a resource held while a call runs, built from its
    arguments (``"ticket:{ticket_id}"``). ``requires_approval`` (True, or a function of the arguments
    returning whether to ask) parks each call until a person approves or denies it; an unanswered
    request is denied after ``approval_expires_s``. An option not listed here is a configuration error.
    """
    if unknown:
        raise ConfigurationError(f"@tool got unknown option(s) {', '.join(sorted(unknown))}; known: "
                                 f"{', '.join(TOOL_OPTIONS)}")

    def wrap(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        desc = description or doc.split("\n\n")[0].strip()
        if not desc:
            raise ConfigurationError(f"tool {tool_name!r} needs a description (a docstring) for the model")
        if tier is not None and tier not in TIERS:
            raise ConfigurationError(f"tool {tool_name!r}: tier must be one of {', '.join(TIERS)}")
        for what, value in (("timeout_s", timeout_s), ("cache_ttl_s", cache_ttl_s)):
            if value is not None and value < 0:
                raise ConfigurationError(f"tool {tool_name!r}: {what} cannot be negative")
        if approval_expires_s is not None and approval_expires_s <= 0:
            raise ConfigurationError(f"tool {tool_name!r}: approval_expires_s must be positive")
        if not isinstance(requires_approval, bool) and not callable(requires_approval):
            raise ConfigurationError(f"tool {tool_name!r}: requires_approval is True/False or a function of the "
                                     "arguments")
        if requires_approval and read_only:
            raise ConfigurationError(f"tool {tool_name!r}: a read_only tool's results are cached and reused; it "
                                     "cannot also require approval")
        if cache_ttl_s is not None and not read_only:
            raise ConfigurationError(f"tool {tool_name!r}: cache_ttl_s is for read_only tools")
        if fallback == tool_name:
            raise ConfigurationError(f"tool {tool_name!r} cannot be its own fallback")
        args_model, context_param = _arguments_model(fn, tool_name)
        _check_lock_template(lock, tool_name, set(args_model.model_fields))
        schema = args_model.model_json_schema()
        schema.pop("title", None)
        return Tool(
            name=tool_name,
            description=desc,
            func=fn,
            args_model=args_model,
            context_param=context_param,
            timeout_s=timeout_s,
            tier=tier,
            idempotent=idempotent or read_only,
            read_only=read_only,
            cache_ttl_s=cache_ttl_s,
            health_check=as_health_check(health_check, tool_name, tier or "local"),
            fallback=fallback,
            lock=lock,
            response_limit=response_limit,
            parameters=schema,
            requires_approval=requires_approval,
            approval_expires_s=approval_expires_s,
        )

    return wrap(func) if func is not None else wrap


TOOL_OPTIONS = tuple(p for p in inspect.signature(tool).parameters if p not in ("func", "unknown"))


def _check_lock_template(template: str | None, tool_name: str, params: set[str]) -> None:
    """A lock names plain arguments only: no attribute or index access, nothing the model does not send."""
    if template is None:
        return
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigurationError(f"tool {tool_name!r}: lock template {template!r}: {exc}") from None
    for f in fields:
        if not f.isidentifier() or f not in params:
            raise ConfigurationError(f"tool {tool_name!r}: lock template {template!r} names {f!r}, which is not "
                                     f"one of its arguments ({', '.join(sorted(params)) or 'none'})")


def _arguments_model(fn: Callable[..., Any], tool_name: str) -> tuple[type[BaseModel], str | None]:
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")
        annotation = hints.get(param.name)
        if annotation is None:
            raise ConfigurationError(f"tool {tool_name!r}: parameter {param.name!r} needs a type annotation")
        if annotation is ToolContext:
            context_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(  # type: ignore[call-overload]
        f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model, context_param
