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

import json
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from agentfleet.errors import ConfigurationError
from agentfleet.sandbox.options import Sandbox, sandbox_of
from agentfleet.sandbox.process import SUBPROCESS_MAX_OUTPUT
from agentfleet.tools.options import DEFAULT_TOOL_RESPONSE_LIMIT, LargeOutput, ToolOptions
from agentfleet.tools.sandboxed import sandbox_check
from agentfleet.tools.tool import Command, Tool, checked_schema, declare

MANIFEST_SUFFIXES = (".tool.toml", ".tool.json")


def subprocess_tool(
    name: str,
    argv: Sequence[str],
    *,
    description: str,
    schema: dict[str, Any],
    directory: str | Path | None = None,
    sandbox: Sandbox | dict[str, Any] | None = None,
    max_output: int = SUBPROCESS_MAX_OUTPUT,
    source: str | None = None,
    **options: Any,
) -> Tool:
    """Declare a tool that runs ``argv`` for each call; ``./x`` in ``argv`` is a file in ``directory``.

    ``schema`` is the JSON Schema of its arguments (an object). ``sandbox`` says what it may see and use
    (default: no network, no files but its own, default rlimits). Output over ``response_limit`` is kept
    as an artifact (``large_output="refuse"``: RESPONSE_TOO_LARGE); over ``max_output`` bytes the tool is
    stopped. The other options are ``ToolOptions``, as ``@tool`` takes them.
    """
    checked = ToolOptions.of("subprocess_tool", name, {"large_output": "artifact", **options})
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise ConfigurationError(f"tool {name!r}: argv is a non-empty list of non-empty strings")
    folder = Path(directory).resolve() if directory is not None else None
    if any(a.startswith("./") for a in argv):
        if folder is None:
            raise ConfigurationError(f"tool {name!r}: argv names ./ files but no directory is given")
        for a in argv:
            if a.startswith("./") and not (folder / a[2:]).is_file():
                raise ConfigurationError(f"tool {name!r}: {folder / a[2:]} does not exist")
    box = sandbox_of(sandbox, name)
    if max_output < checked.response_limit:
        raise ConfigurationError(f"tool {name!r}: max_output ({max_output}) is below response_limit")
    if checked.health_check is None:
        checked = checked.model_copy(update={"health_check": sandbox_check()})
    return declare(name, description, checked_schema(schema, f"tool {name!r}"), checked,
                   command=Command(tuple(argv), folder, box, max_output), source=source)


class ToolManifest(ToolOptions):
    """A tool declared in a file next to its executable: the file's own keys, then ``ToolOptions`` (a health
    check is a command line there, approval a yes or no). Unknown keys are configuration errors."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    sandbox: Sandbox = Field(default_factory=Sandbox)
    max_output: int = Field(default=SUBPROCESS_MAX_OUTPUT, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    health_check: list[str] | None = None
    response_limit: int = Field(default=DEFAULT_TOOL_RESPONSE_LIMIT, ge=1)
    requires_approval: bool = False
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
    options = {k: getattr(manifest, k) for k in ToolOptions.names()}
    try:
        return subprocess_tool(manifest.name, manifest.command, description=manifest.description,
                               schema=manifest.parameters, directory=file.parent, source=str(file),
                               sandbox=manifest.sandbox, max_output=manifest.max_output, **options)
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
