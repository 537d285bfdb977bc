"""``@tool``: a typed Python function becomes a declared capability with a JSON Schema.

Arguments are validated by a pydantic model built from the signature, so the
schema the model sees and the validation the executor applies are one thing.
A parameter annotated ``ToolContext`` is injected, never shown to the model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agentfleet.constants import DEFAULT_TOOL_RESPONSE_LIMIT
from agentfleet.errors import ConfigurationError, ErrorCode, ToolError
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
    idempotent: bool = False
    read_only: bool = False
    permissions: tuple[str, ...] = ()
    response_limit: int = DEFAULT_TOOL_RESPONSE_LIMIT
    parameters: dict[str, Any] = field(default_factory=dict)

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
    idempotent: bool = False,
    read_only: bool = False,
    permissions: tuple[str, ...] = (),
    response_limit: int = DEFAULT_TOOL_RESPONSE_LIMIT,
) -> Any:
    """Declare a tool. Usable bare (``@tool``) or with options (``@tool(idempotent=True)``)."""

    def wrap(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        desc = description or doc.split("\n\n")[0].strip()
        if not desc:
            raise ConfigurationError(f"tool {tool_name!r} needs a description (a docstring) for the model")
        args_model, context_param = _arguments_model(fn, tool_name)
        schema = args_model.model_json_schema()
        schema.pop("title", None)
        return Tool(
            name=tool_name,
            description=desc,
            func=fn,
            args_model=args_model,
            context_param=context_param,
            timeout_s=timeout_s,
            idempotent=idempotent or read_only,
            read_only=read_only,
            permissions=tuple(permissions),
            response_limit=response_limit,
            parameters=schema,
        )

    return wrap(func) if func is not None else wrap


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
