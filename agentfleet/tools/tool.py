"""``@tool``: a typed Python function becomes a declared capability with a JSON Schema.

Arguments are validated by a pydantic model built from the signature, so the
schema the model sees and the validation the executor applies are one thing.
A parameter annotated ``ToolContext`` is injected, never shown to the model.
Every kind of tool (a Python function here, an executable in ``subprocess_tool``)
is declared through ``declare``, which checks the options they share. A tool that
runs as a process of its own carries a ``Command`` (data); the harness's runner
chooses how to run each tool from that data.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from agentfleet.context.counting import spec_chars
from agentfleet.errors import ConfigurationError, ErrorCode, ToolError
from agentfleet.events.domain import problems
from agentfleet.loop.decisions import schema_errors, schema_problem
from agentfleet.sandbox.options import Sandbox, sandbox_of
from agentfleet.sandbox.process import SUBPROCESS_MAX_OUTPUT
from agentfleet.tools.health import HealthCheck, as_health_check
from agentfleet.tools.options import ToolOptions
from agentfleet.tools.sandboxed import python_argv_and_sandbox, sandbox_check
from agentfleet.tools.workspace import Workspace

if TYPE_CHECKING:
    from agentfleet.config.settings import Settings  # the timeout tiers' values; tools sit below config

class ToolCancelled(ToolError):
    """Raised by ``ToolContext.heartbeat`` once the call should stop: its run was cancelled, or it timed out."""

    def __init__(self, why: str) -> None:
        super().__init__(why, code=ErrorCode.CANCELLED, hint="The run no longer wants this call's result.")


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may know about the step it serves."""

    run_id: str
    call_id: str
    idempotency_key: str  # pass it to outside systems (payment APIs, ticketing) that dedupe
    workspace: Path
    attempt: int = 1
    deadline_at: float | None = None  # the run's deadline (epoch seconds): past it the call stops, like a cancel
    # Set by the executor: whether the call's run was cancelled (read from the fleet), and where a heartbeat
    # is recorded. The runner adds its own stop (the timeout) through ``stop``.
    cancel_check: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    heartbeat_sink: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)
    stopped: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    # Set by the executor: part of an artifact this run may read, (bytes, whole size), or None (read_artifact).
    artifact: Callable[[str, int, int], tuple[bytes, int] | None] | None = field(default=None, repr=False,
                                                                                 compare=False)
    # Domain events this call published (name, payload), sent once its step commits; and those refused.
    published: list[tuple[str, dict[str, Any]]] = field(default_factory=list, repr=False, compare=False)
    refused: list[tuple[str, Any, str]] = field(default_factory=list, repr=False, compare=False)

    def publish(self, name: str, payload: dict[str, Any]) -> None:
        """Publish domain event ``name`` (``domain.<name>``) once this call's step commits: a retried step
        does not publish twice. A payload that breaks the event's schema is refused: the event is
        dead-lettered with the reason and this raises INVALID_ARGUMENTS."""
        found = problems(name, payload)
        if found:
            self.refused.append((name, payload, "; ".join(found)))
            raise ToolError(f"domain event {name!r} refused: {'; '.join(found)}", code=ErrorCode.INVALID_ARGUMENTS,
                            hint=f"Publish {name} with a payload matching its schema.")
        self.published.append((name, dict(payload)))

    @property
    def cancelled(self) -> bool:
        """Whether this call should stop now: its run was cancelled, or the harness gave up on it (timeout).

        A long in-process tool looks at this between units of work; a subprocess tool is stopped for it."""
        if self.stopped.is_set() or self.past_deadline:
            return True
        return bool(self.cancel_check and self.cancel_check())

    @property
    def past_deadline(self) -> bool:
        return self.deadline_at is not None and time.time() >= self.deadline_at

    def time_left(self, timeout_s: float) -> float:
        """``timeout_s``, or less when the run's deadline comes first."""
        if self.deadline_at is None:
            return timeout_s
        return max(0.0, min(timeout_s, self.deadline_at - time.time()))

    def heartbeat(self, details: Any = None) -> None:
        """Say the call is alive (``details``: how far it got, shown to operators), and stop if it should:
        raises ``ToolCancelled``, which the harness turns into a CANCELLED result."""
        if self.heartbeat_sink is not None:
            self.heartbeat_sink(details)
        if self.cancelled:
            raise ToolCancelled(f"call {self.call_id} was stopped: its run was cancelled or it ran out of time")

    def stop(self) -> None:
        self.stopped.set()

    @property
    def files(self) -> Workspace:
        """Open and walk files beneath the workspace without following links (safe against swaps); hidden
        files and version-control folders are refused and skipped."""
        return Workspace(self.workspace)

    def workspace_files(self, *, hidden: bool = False) -> Workspace:
        """``files``, and with ``hidden=True`` dotfiles and version-control folders too: a tool that needs them
        (one that reads .gitignore, say) opts in, in its own code."""
        return Workspace(self.workspace, hidden=hidden)

    def resolve(self, relative: str) -> Path:
        """A path inside the workspace, to name or show; open files with ``files`` (checked, then opened
        by name, a path can be swapped for a link in between)."""
        self.files.parts(relative)  # hidden names and '..' are refused here too
        candidate = (self.workspace / relative).resolve()
        if candidate != self.workspace and self.workspace not in candidate.parents:
            raise ToolError(
                f"path {relative!r} is outside the workspace",
                code=ErrorCode.PERMISSION_DENIED,
                hint="Use a path relative to the workspace root, without '..'.",
            )
        return candidate


@dataclass(frozen=True)
class Command:
    """How a tool that runs as a process of its own is started, as data: what to run (``./x`` names a file of
    ``directory``), under which sandbox, and how much of its stdout to read. The decorator records it; the
    harness decides how to run it (Temporal's activity definitions work the same way)."""

    argv: tuple[str, ...]
    directory: Path | None
    sandbox: Sandbox
    max_output: int = SUBPROCESS_MAX_OUTPUT


@dataclass(frozen=True)
class Produced:
    """What a tool returned, before the harness checks that it is JSON and within its limit."""

    value: Any
    encoded: str | None = None  # the value as JSON, when the tool printed it so (no second encoding)
    # (reference, content): files kept by the call, as bytes or a file the store streams in
    artifacts: tuple[tuple[dict[str, Any], Any], ...] = ()


class Tool(ToolOptions):
    """A declared tool: what the model sees (name, description, parameters), how its arguments are bound, how it
    runs (a function in the executor, or a ``Command`` in the sandbox), and its options. Made by ``declare``."""

    name: str
    description: str
    func: Callable[..., Any] | None
    args_model: type[BaseModel] | None  # None: arguments are checked against ``parameters`` (JSON Schema)
    context_param: str | None = None
    health_check: HealthCheck | None = None  # the declared check, resolved
    parameters: dict[str, Any] = Field(default_factory=dict)
    command: Command | None = None  # a process of its own in the sandbox; None: the function runs in the executor
    source: str | None = None  # where it was declared: a module, a manifest file, a plugin

    @property
    def leaves_artifacts(self) -> bool:
        """Whether a call may keep content as an artifact (its agent is then offered ``read_artifact``)."""
        return self.large_output == "artifact" or (self.command is not None and self.command.sandbox.keep_workdir)

    @property
    def kind(self) -> str:
        return "subprocess" if self.command is not None else "python"

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

    @functools.cached_property
    def spec_chars(self) -> int:
        """The declaration's size as the context's counter measures it, measured once (a tool is frozen)."""
        return spec_chars(self.spec())

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments, or INVALID_ARGUMENTS with the schema's complaints."""
        if self.args_model is None:
            return _schema_checked(self.name, self.parameters, arguments)
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

    def bound_json(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the tool will receive them (validated and converted: ``"5e3"`` is ``5000.0`` for a
        float), in JSON: what policy, approval rules and people decide on, and so exactly what runs. Raises
        INVALID_ARGUMENTS like ``bind``."""
        from pydantic_core import to_jsonable_python

        return dict(to_jsonable_python(self.bind(arguments)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.func is None:
            raise ConfigurationError(f"tool {self.name!r} is a {self.kind} tool: the executor runs it, not a call")
        return self.func(*args, **kwargs)


def _schema_checked(name: str, schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    problems = schema_errors(schema, arguments)
    if problems:
        raise ToolError(f"arguments for {name} are invalid: {'; '.join(problems)}", code=ErrorCode.INVALID_ARGUMENTS,
                        hint=f"Call {name} with arguments matching its JSON Schema.")
    return dict(arguments)


def checked_schema(schema: Any, owner: str) -> dict[str, Any]:
    """A tool's argument schema as declared outside Python: a valid JSON Schema of an object."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ConfigurationError(f"{owner}: its schema must be a JSON Schema object with \"type\": \"object\"")
    problem = schema_problem(schema)
    if problem is not None:
        raise ConfigurationError(f"{owner}: its schema is not a valid JSON Schema: {problem}")
    return schema


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    sandbox: Any = None,
    **options: Any,
) -> Any:
    """Declare a tool. Usable bare (``@tool``) or with options (``@tool(idempotent=True)``).

    ``name`` and ``description`` default to the function's name and the first paragraph of its docstring.
    ``sandbox`` (True, or a ``Sandbox``) runs each call as a subprocess in the sandbox, killed at its timeout,
    instead of in a thread of the executor. The other options are ``ToolOptions``; any other is a
    configuration error.
    """
    ToolOptions.refuse_unknown("@tool", options)

    def wrap(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        checked = ToolOptions.of("@tool", tool_name, options)
        desc = description or (inspect.getdoc(fn) or "").split("\n\n")[0].strip()
        if not desc:
            raise ConfigurationError(f"tool {tool_name!r} needs a description (a docstring) for the model")
        args_model, context_param = _arguments_model(fn, tool_name)
        schema = args_model.model_json_schema()
        schema.pop("title", None)
        command, settled = None, checked
        if sandbox:  # recorded as data: the function's module is imported again in a sandboxed process
            argv, widened = python_argv_and_sandbox(fn, tool_name, sandbox_of(sandbox, tool_name))
            command = Command(tuple(argv), None, widened)
            if checked.health_check is None:
                settled = checked.model_copy(update={"health_check": sandbox_check()})
        return declare(tool_name, desc, schema, settled, func=fn, command=command, args_model=args_model,
                       context_param=context_param, source=getattr(fn, "__module__", None))

    return wrap(func) if func is not None else wrap


def declare(name: str, description: str, parameters: dict[str, Any], options: ToolOptions, *,
            func: Callable[..., Any] | None = None, args_model: type[BaseModel] | None = None,
            context_param: str | None = None, command: Command | None = None, source: str | None = None) -> Tool:
    """A tool of any kind, its options checked against its arguments: the one place a declaration becomes a
    ``Tool``."""
    if not description:
        raise ConfigurationError(f"tool {name!r} needs a description (a docstring) for the model")
    options.check(name)
    params = set(args_model.model_fields) if args_model is not None else set(parameters.get("properties", {}))
    options.check_lock(name, params)
    values = options.model_dump(exclude={"health_check"})
    values["idempotent"] = options.idempotent or options.read_only
    return Tool.model_construct(  # every field checked above, or made by the harness's own code
        **values, name=name, description=description, func=func, args_model=args_model,
        context_param=context_param, health_check=as_health_check(options.health_check, name, options.tier or "local"),
        parameters=parameters, command=command, source=source)


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
