"""Tools in any language: an executable that reads its arguments as JSON on stdin and answers JSON on stdout.

Declared in Python (``subprocess_tool``) or in a manifest next to the executable
(``<name>.tool.toml`` or ``.tool.json``); both go through ``declare``, so a subprocess
tool has every option a Python tool has (health check, fallback, approval, lock…).

The contract, for tool authors:

* stdin: one JSON object, the arguments, already checked against the declared schema;
* stdout: one JSON value, the result (exit 0);
* failure: exit non-zero; the message is the tail of stderr, or print
  ``{"error": {"code": "INVALID_ARGUMENTS", "message": "...", "hint": "..."}}`` to name a code;
* environment: ``AGENTFLEET_RUN_ID``, ``AGENTFLEET_CALL_ID``, ``AGENTFLEET_IDEMPOTENCY_KEY``
  (pass it to outside systems that dedupe), ``AGENTFLEET_ATTEMPT``, plus what the tool declares;
* domain events: append ``{"name": "ticket.triaged", "payload": {...}}`` lines to the file
  ``$AGENTFLEET_EVENTS`` names; they are published once the call's step commits (harness/tool_events.py);
* files: its own directory read-only at ``/sandbox/tool``, a private writable ``/sandbox/work`` (current directory).
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentfleet import constants as C
from agentfleet.errors import ConfigurationError, ErrorCode
from agentfleet.harness import tool_events
from agentfleet.harness.artifacts import content_ref
from agentfleet.harness.health import Tier
from agentfleet.harness.process import Exited, run_child
from agentfleet.harness.sandbox import TOOLDIR, WORKDIR, Sandbox, as_user, bwrap_argv, make_workdir, support, tool_env
from agentfleet.harness.tool import LargeOutput, Produced, Tool, ToolContext, checked_schema, declare
from agentfleet.loop.transcript import ToolResult

log = logging.getLogger(__name__)

CALLS_ROOT = Path(tempfile.gettempdir()) / "agentfleet-calls"  # one private work directory per call beneath
MANIFEST_SUFFIXES = (".tool.toml", ".tool.json")
# Codes a tool may name for its own failure; the others are the harness's to give.
TOOL_CODES = frozenset({ErrorCode.INVALID_ARGUMENTS, ErrorCode.PERMISSION_DENIED, ErrorCode.TRANSIENT,
                        ErrorCode.INTERNAL, ErrorCode.TOOL_UNAVAILABLE, ErrorCode.RESOURCE_LIMIT})
SIGNALS_OF_LIMITS = {24: "CPU time", 25: "file size"}  # SIGXCPU, SIGXFSZ
MESSAGE_TAIL = 1000
HEAD_SHOWN = 300


@dataclass(frozen=True)
class SubprocessRunner:
    """Runs a tool's executable for each call, under its sandbox."""

    argv: tuple[str, ...]
    directory: Path | None
    sandbox: Sandbox = field(default_factory=Sandbox)
    max_output: int = C.SUBPROCESS_MAX_OUTPUT
    kind: str = "subprocess"

    def run(self, tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, timeout_s: float) -> Produced | ToolResult:
        here = support()
        sandboxed = here.available
        if not sandboxed and self.sandbox.required:
            return ToolResult.failure(
                ErrorCode.TOOL_UNAVAILABLE, f"{tool.name} runs only in the sandbox, and {here.detail}",
                "Do without this tool; the operator must install bubblewrap on the executor hosts.", retryable=True)
        if not sandboxed:
            log.warning("running %s WITHOUT the sandbox (it declared required=False): %s", tool.name, here.detail,
                        extra={"tool": tool.name, "run_id": ctx.run_id})
        workdir = make_workdir(CALLS_ROOT, tool.name)
        try:
            events_file = f"{WORKDIR if sandboxed else workdir}/{C.TOOL_EVENTS_FILE}"
            env = tool_env(self.sandbox) | _call_env(ctx) | {tool_events.ENV: events_file}
            if sandboxed:
                argv = bwrap_argv(self.sandbox, workdir, self.directory, self.command(TOOLDIR), env=env)
                cwd, child_env = None, {}
            else:
                argv, cwd, child_env = self.command(str(self.directory or workdir)), str(workdir), env
            try:
                exited = run_child(argv, json.dumps(kwargs).encode(), timeout_s=timeout_s,
                                   cancelled=lambda: ctx.cancelled, max_stdout=self.max_output, cwd=cwd,
                                   env=child_env, popen=as_user(self.sandbox.limits))
            except OSError as exc:
                return ToolResult.failure(ErrorCode.TOOL_UNAVAILABLE, f"{tool.name} could not be started: {exc}",
                                          "Do without this tool for now.", retryable=True)
            read = read_exit(tool, exited, self.sandbox, timeout_s, self.max_output)
            events = tool_events.read_events(workdir, tool.name)
            if isinstance(events, ToolResult):
                return events if isinstance(read, Produced) else read
            refused = tool_events.publish_events(ctx, events, succeeded=isinstance(read, Produced))
            if refused is not None and isinstance(read, Produced):
                return refused
            if self.sandbox.keep_workdir and isinstance(read, Produced):
                kept = _tarball(workdir)
                ref = {"ref": content_ref(kept), "kind": "workdir", "size": len(kept),
                       "media_type": "application/gzip"}
                read = Produced(read.value, read.encoded, (*read.artifacts, (ref, kept)))
            return read
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    @property
    def keeps_files(self) -> bool:
        return self.sandbox.keep_workdir

    def command(self, tool_dir: str) -> list[str]:
        """``argv`` with ``./`` paths resolved in the tool's directory (``/sandbox/tool`` inside the sandbox)."""
        return [f"{tool_dir}/{a[2:]}" if a.startswith("./") else a for a in self.argv]


def read_exit(tool: Tool, exited: Exited, sandbox: Sandbox, timeout_s: float, max_output: int
              ) -> Produced | ToolResult:
    """How the call ended, as its output or its structured failure. Pure."""
    name = tool.name
    if exited.stopped == "cancelled":
        return ToolResult.failure(ErrorCode.CANCELLED, f"{name} was stopped: its run was cancelled")
    if exited.stopped == "timeout":
        return ToolResult.failure(ErrorCode.TIMEOUT, f"{name} did not finish within {timeout_s:g}s; it and every "
                                                     "process it started were killed",
                                  "The tool may be overloaded; try narrower arguments or another tool.")
    if exited.stopped == "overflow":
        return ToolResult.failure(ErrorCode.RESPONSE_TOO_LARGE, f"{name} printed more than {max_output} bytes and "
                                                                "was stopped", "Ask for less: a narrower input.")
    sig = exited.signal
    if sig in SIGNALS_OF_LIMITS:
        limits = sandbox.limits
        limit = f"{limits.cpu_s} s" if sig == 24 else f"{limits.file_size_mb} MiB"
        return ToolResult.failure(ErrorCode.RESOURCE_LIMIT, f"{name} ran past its {SIGNALS_OF_LIMITS[sig]} limit "
                                                            f"({limit}) and was stopped",
                                  "Do not repeat the call unchanged: give it less work.")
    stderr = exited.stderr_tail.decode(errors="replace").strip()
    if exited.returncode != 0:
        named = _named_error(exited.stdout)
        if named is not None:
            return named
        how = f"was killed by signal {sig}" if sig is not None else f"exited {exited.returncode}"
        tail = stderr[-MESSAGE_TAIL:]
        return ToolResult.failure(ErrorCode.INTERNAL, f"{name} {how}" + (f": {tail}" if tail else ""),
                                  "This is a bug or outage in the tool; do not retry the same call unchanged.")
    text = exited.stdout.decode(errors="replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        head = text[:HEAD_SHOWN] or "(nothing)"
        return ToolResult.failure(ErrorCode.INTERNAL, f"{name} printed output that is not JSON: {head}",
                                  "This is a bug in the tool; do not retry the same call unchanged.")
    return Produced(value, text)


def _named_error(stdout: bytes) -> ToolResult | None:
    try:
        said = json.loads(stdout.decode(errors="replace"))
        error = said["error"]
        code = ErrorCode(error["code"])
    except (ValueError, KeyError, TypeError):
        return None
    if code not in TOOL_CODES or not isinstance(error.get("message"), str):
        return None
    hint = error.get("hint")
    return ToolResult.failure(code, error["message"][:MESSAGE_TAIL], hint if isinstance(hint, str) else None,
                              retryable=code == ErrorCode.TRANSIENT)


def _call_env(ctx: ToolContext) -> dict[str, str]:
    return {"AGENTFLEET_RUN_ID": ctx.run_id, "AGENTFLEET_CALL_ID": ctx.call_id,
            "AGENTFLEET_IDEMPOTENCY_KEY": ctx.idempotency_key, "AGENTFLEET_ATTEMPT": str(ctx.attempt)}


def _tarball(directory: Path) -> bytes:
    """The work directory as a gzipped tar, without following links the tool left in it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", dereference=False) as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buf.getvalue()


def subprocess_tool(
    name: str,
    argv: Sequence[str],
    *,
    description: str,
    schema: dict[str, Any],
    directory: str | Path | None = None,
    sandbox: Sandbox | dict[str, Any] | None = None,
    max_output: int = C.SUBPROCESS_MAX_OUTPUT,
    timeout_s: float | None = None,
    tier: Tier | None = None,
    idempotent: bool = False,
    read_only: bool = False,
    cache_ttl_s: float | None = None,
    health_check: object = None,
    fallback: str | None = None,
    lock: str | None = None,
    response_limit: int = C.DEFAULT_TOOL_RESPONSE_LIMIT,
    requires_approval: Any = False,
    approval_expires_s: float | None = None,
    large_output: LargeOutput = "artifact",
    source: str | None = None,
    **unknown: Any,
) -> Tool:
    """Declare a tool that runs ``argv`` for each call; ``./x`` in ``argv`` is a file in ``directory``.

    ``schema`` is the JSON Schema of its arguments (an object). ``sandbox`` says what it may see and use
    (default: no network, no files but its own, default rlimits). Output over ``response_limit`` is kept
    as an artifact (``large_output="refuse"``: RESPONSE_TOO_LARGE); over ``max_output`` bytes the tool is
    stopped. The other options are ``@tool``'s.
    """
    if unknown:
        raise ConfigurationError(f"subprocess_tool {name!r} got unknown option(s) {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(SUBPROCESS_OPTIONS)}")
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise ConfigurationError(f"tool {name!r}: argv is a non-empty list of non-empty strings")
    folder = Path(directory).resolve() if directory is not None else None
    if any(a.startswith("./") for a in argv):
        if folder is None:
            raise ConfigurationError(f"tool {name!r}: argv names ./ files but no directory is given")
        for a in argv:
            if a.startswith("./") and not (folder / a[2:]).is_file():
                raise ConfigurationError(f"tool {name!r}: {folder / a[2:]} does not exist")
    box = _sandbox_of(sandbox, name)
    if max_output < response_limit:
        raise ConfigurationError(f"tool {name!r}: max_output ({max_output}) is below response_limit")
    runner = SubprocessRunner(tuple(argv), folder, box, max_output)
    return declare(
        name, description, checked_schema(schema, f"tool {name!r}"), runner=runner, source=source,
        timeout_s=timeout_s, tier=tier, idempotent=idempotent, read_only=read_only, cache_ttl_s=cache_ttl_s,
        health_check=health_check if health_check is not None else (sandbox_check() if box.required else None),
        fallback=fallback, lock=lock, response_limit=response_limit, requires_approval=requires_approval,
        approval_expires_s=approval_expires_s, large_output=large_output)


def python_runner(fn: Any, tool_name: str, sandbox: Sandbox | bool | dict[str, Any]) -> SubprocessRunner:
    """The runner of a Python tool that opted in to the sandbox (``@tool(sandbox=...)``)."""
    from agentfleet.harness.sandboxed_python import python_argv_and_sandbox

    box = _sandbox_of(Sandbox() if sandbox is True else sandbox, tool_name)
    argv, widened = python_argv_and_sandbox(fn, tool_name, box)
    return SubprocessRunner(tuple(argv), None, widened)


def _sandbox_of(sandbox: Any, tool_name: str) -> Sandbox:
    try:
        return sandbox if isinstance(sandbox, Sandbox) else Sandbox.model_validate(sandbox or {})
    except ValidationError as exc:
        raise ConfigurationError(f"tool {tool_name!r}: its sandbox is invalid: {_first(exc)}") from None


SUBPROCESS_OPTIONS = ("description", "schema", "directory", "sandbox", "max_output", "timeout_s", "tier",
                      "idempotent", "read_only", "cache_ttl_s", "health_check", "fallback", "lock",
                      "response_limit", "requires_approval", "approval_expires_s", "large_output")


def sandbox_check() -> Any:
    """The health check every sandboxed tool shares by default: can bubblewrap build a sandbox here?"""
    from agentfleet.harness.health import health_check

    return health_check(C.SANDBOX_CHECK, _sandbox_ready, tier="local", timeout_s=10)


def _sandbox_ready() -> str:
    found = support(refresh=True)
    if not found.available:
        raise RuntimeError(found.detail)
    return found.detail


class ToolManifest(BaseModel):
    """A tool declared in a file next to its executable. Unknown keys are configuration errors."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    sandbox: Sandbox = Field(default_factory=Sandbox)
    timeout_s: float | None = Field(default=None, gt=0)
    tier: Tier | None = None
    idempotent: bool = False
    read_only: bool = False
    cache_ttl_s: float | None = None
    health_check: list[str] | None = None
    fallback: str | None = None
    lock: str | None = None
    response_limit: int = Field(default=C.DEFAULT_TOOL_RESPONSE_LIMIT, ge=1)
    max_output: int = Field(default=C.SUBPROCESS_MAX_OUTPUT, ge=1)
    requires_approval: bool = False
    approval_expires_s: float | None = None
    large_output: LargeOutput = "artifact"


def load_tool_manifest(path: str | Path) -> Tool:
    """The tool a manifest file declares, or a ConfigurationError naming the file and the fault."""
    file = Path(path).resolve()
    try:
        raw = file.read_bytes()
        data = tomllib.loads(raw.decode()) if file.name.endswith(".toml") else json.loads(raw)
        manifest = ToolManifest.model_validate(data)
    except (OSError, UnicodeDecodeError, ValueError, tomllib.TOMLDecodeError) as exc:
        problem = _first(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ConfigurationError(f"tool manifest {file}: {problem}") from None
    options = manifest.model_dump(exclude={"name", "description", "command", "parameters", "health_check"})
    options["sandbox"] = manifest.sandbox
    try:
        return subprocess_tool(manifest.name, manifest.command, description=manifest.description,
                               schema=manifest.parameters, directory=file.parent, source=str(file),
                               health_check=manifest.health_check, **options)
    except ConfigurationError as exc:
        raise ConfigurationError(f"tool manifest {file}: {exc}") from None


def load_tool_folder(folder: str | Path) -> list[Tool]:
    """Every tool declared by a manifest in ``folder`` (not its subfolders), in name order."""
    root = Path(folder)
    files = sorted(p for p in root.iterdir() if p.name.endswith(MANIFEST_SUFFIXES))
    return [load_tool_manifest(p) for p in files]


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]
