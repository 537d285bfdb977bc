"""What a sandboxed tool may see and use, as data: the options a tool author writes (``Sandbox``,
``ResourceLimits``), validated when the tool is declared. ``bwrap`` and ``call_bounds`` enforce them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentfleet.errors import ConfigurationError

# The default bounds of one call (a tool may set its own).
SANDBOX_CPU_S = 10
SANDBOX_MEMORY_MB = 1024
SANDBOX_OPEN_FILES = 256
SANDBOX_FILE_SIZE_MB = 64
SANDBOX_PROCESSES = 64
SANDBOX_TMP_MB = 64
SANDBOX_WORKDIR_MB = 256  # a call's work directory: a tmpfs in its sandbox


SANDBOX_ROOT = "/sandbox"  # where the call's own directories appear; no host path is shown beneath it


class ResourceLimits(BaseModel):
    """What one call may use, bounded for that call alone (``call_bounds`` says how this host enforces each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_s: int = Field(default=SANDBOX_CPU_S, ge=1, description="CPU seconds before SIGXCPU, then SIGKILL")
    memory_mb: int = Field(default=SANDBOX_MEMORY_MB, ge=16, description="Memory of all the call's processes "
                                                                         "together (and each one's address space)")
    open_files: int = Field(default=SANDBOX_OPEN_FILES, ge=8)
    file_size_mb: int = Field(default=SANDBOX_FILE_SIZE_MB, ge=1, description="Largest file it may write")
    processes: int = Field(default=SANDBOX_PROCESSES, ge=4, description="Processes of the call")
    tmp_mb: int = Field(default=SANDBOX_TMP_MB, ge=1, description="Size of its private /tmp and /dev/shm each")
    workdir_mb: int = Field(default=SANDBOX_WORKDIR_MB, ge=1, description="Size of its work directory")


class Sandbox(BaseModel):
    """What a subprocess tool may see and use. Unknown fields are configuration errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    network: bool = Field(default=False, description="Share the host's network (default: none at all)")
    env: dict[str, str] = Field(default_factory=dict, description="Variables set for the tool")
    pass_env: tuple[str, ...] = Field(default=(), description="Worker variables passed through by name")
    read_only: tuple[str, ...] = Field(default=(), description="More host paths visible read-only, same path")

    @field_validator("read_only")
    @classmethod
    def _outside_the_sandbox_dirs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not path.startswith("/") or path == "/" or path.startswith(SANDBOX_ROOT):
                raise ValueError(f"{path!r}: read_only paths are absolute host paths, not / and not under "
                                 f"{SANDBOX_ROOT}")
        return value
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    keep_workdir: bool = Field(default=False, description="Keep the work directory as an artifact after the call")
    required: bool = Field(default=True, description="Always true: a sandboxed tool never runs bare")

    @field_validator("required")
    @classmethod
    def _no_opt_out(cls, value: bool) -> bool:
        if not value:
            raise ValueError("required = false is no longer accepted: a tool run outside the sandbox could read the "
                             "worker's environment (/proc/<pid>/environ) and leave processes behind; a tool that "
                             "cannot run in the sandbox is refused (TOOL_UNAVAILABLE) instead")
        return value


def sandbox_of(sandbox: Any, tool_name: str) -> Sandbox:
    """A tool's declared sandbox (``True``, a dict or a ``Sandbox``), or a ConfigurationError naming the fault."""
    try:
        return sandbox if isinstance(sandbox, Sandbox) else Sandbox.model_validate(
            {} if sandbox is True or not sandbox else sandbox)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigurationError(f"tool {tool_name!r}: its sandbox is invalid: "
                                 f"{f'{where}: ' if where else ''}{err['msg']}") from None
