"""Running a subprocess tool's command for one call: under bubblewrap, within its limits, into a result.

The tool's side of the contract (arguments on stdin, the result on stdout, a named
error, the events file, the files it sees) is written where tools are declared,
``tools/manifest.py``; this module keeps it: it starts the command in the sandbox,
reads what the process left within its bounds, and turns every way it can end into
a structured result.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentfleet.errors import ErrorCode
from agentfleet.harness import tool_events
from agentfleet.harness.tool_events import TOOL_EVENTS_MAX_BYTES
from agentfleet.loop.transcript import ToolResult
from agentfleet.sandbox.bwrap import TOOLDIR, WORKDIR, bounds_for, bwrap_args, guarded, support, tool_env
from agentfleet.sandbox.options import ResourceLimits, Sandbox
from agentfleet.sandbox.process import Exited, Lifeline, SideChannel, run_child
from agentfleet.tools.tool import Command, Produced, Tool, ToolContext

log = logging.getLogger(__name__)

KEPT_SLACK = 1 << 20  # tar headers beyond the work directory's size
COPY_CHUNK = 1 << 20
NO_SPACE = "no space left on device"  # strerror(ENOSPC), as C, Python and Node print it
# Codes a tool may name for its own failure; the others are the harness's to give.
TOOL_CODES = frozenset({ErrorCode.INVALID_ARGUMENTS, ErrorCode.PERMISSION_DENIED, ErrorCode.TRANSIENT,
                        ErrorCode.INTERNAL, ErrorCode.TOOL_UNAVAILABLE, ErrorCode.RESOURCE_LIMIT})
SIGNALS_OF_LIMITS = {24: "CPU time", 25: "file size"}  # SIGXCPU, SIGXFSZ
MESSAGE_TAIL = 1000
HEAD_SHOWN = 300


@dataclass(frozen=True)
class SubprocessRunner:
    """Runs a tool's command for each call, under its sandbox (the harness makes one from the tool's data)."""

    command: Command

    @property
    def sandbox(self) -> Sandbox:
        return self.command.sandbox

    @property
    def directory(self) -> Path | None:
        return self.command.directory

    @property
    def max_output(self) -> int:
        return self.command.max_output

    def run(self, tool: Tool, kwargs: dict[str, Any], ctx: ToolContext, timeout_s: float) -> Produced | ToolResult:
        here = support()
        if not here.available:
            return ToolResult.failure(
                ErrorCode.TOOL_UNAVAILABLE, f"{tool.name} runs only in the sandbox, and {here.detail}",
                "Do without this tool; the operator must install bubblewrap on the executor hosts.", retryable=True)
        limits = self.sandbox.limits
        with contextlib.ExitStack() as stack:
            events = stack.enter_context(SideChannel(io.BytesIO(), TOOL_EVENTS_MAX_BYTES))
            env = tool_env(self.sandbox) | _call_env(ctx) | {tool_events.ENV: f"/proc/self/fd/{events.write_fd}"}
            command = self.argv(TOOLDIR)
            side = [events]
            kept = None
            if self.sandbox.keep_workdir:  # the tree comes out through a pipe once the tool has exited
                spool = stack.enter_context(tempfile.TemporaryFile(prefix="agentfleet-workdir-"))
                kept = stack.enter_context(SideChannel(spool, (limits.workdir_mb << 20) + KEPT_SLACK))
                command = export_workdir(command, kept.write_fd)
                side.append(kept)
            try:
                lifeline = stack.enter_context(Lifeline())
                bounds = stack.enter_context(bounds_for(tool.name, limits))
                for channel in side:  # opened again by path in the sandbox (/proc/self/fd/N): the call's uid
                    bounds.own(channel.write_fd)
                bounds.own(lifeline.read_fd, read_only=True)  # the guard's: no write end may be made of it inside
                args = stack.enter_context(bwrap_args(self.sandbox, self.directory, env))
                exited = run_child(["bwrap", *args.argv, "--", *guarded(command, lifeline.read_fd)],
                                   json.dumps(kwargs).encode(), timeout_s=timeout_s,
                                   cancelled=lambda: ctx.cancelled, max_stdout=self.max_output,
                                   env={},  # bwrap's own process (pid 1 in the sandbox) carries no secret either
                                   popen={"preexec_fn": bounds.preexec, "pass_fds": args.fds}, side=side,
                                   lifeline=lifeline)
            except OSError as exc:
                return ToolResult.failure(ErrorCode.TOOL_UNAVAILABLE, f"{tool.name} could not be started: {exc}",
                                          "Do without this tool for now.", retryable=True)
            read = read_exit(tool, exited, self.sandbox, timeout_s, self.max_output, bounds.exceeded())
            found = tool_events.read_events(events.sink.getvalue(), events.overflowed,  # type: ignore[attr-defined]
                                            tool.name)
            if isinstance(found, ToolResult):
                return found if isinstance(read, Produced) else read
            refused = tool_events.publish_events(ctx, found, succeeded=isinstance(read, Produced))
            if refused is not None and isinstance(read, Produced):
                return refused
            if kept is not None and isinstance(read, Produced):
                return _with_workdir(tool, read, kept, limits)
            return read

    def argv(self, tool_dir: str) -> list[str]:
        """The command with ``./`` paths resolved in the tool's directory (``/sandbox/tool`` inside the sandbox)."""
        return [f"{tool_dir}/{a[2:]}" if a.startswith("./") else a for a in self.command.argv]


def read_exit(tool: Tool, exited: Exited, sandbox: Sandbox, timeout_s: float, max_output: int,
              exceeded: Sequence[str] = ()) -> Produced | ToolResult:
    """How the call ended, as its output or its structured failure (``exceeded``: the per-call bounds its
    cgroup ran into). Pure."""
    name = tool.name
    limits = sandbox.limits
    if exceeded:
        said = {"processes": f"its {limits.processes} processes", "memory": f"{limits.memory_mb} MiB of memory "
                                                                            "in all its processes"}
        return ToolResult.failure(ErrorCode.RESOURCE_LIMIT, f"{name} ran past its per-call bound ("
                                  f"{', '.join(said.get(e, e) for e in exceeded)}) and was stopped",
                                  "Do not repeat the call unchanged: give it less work.")
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
        limit = f"{limits.cpu_s} s" if sig == 24 else f"{limits.file_size_mb} MiB"
        return ToolResult.failure(ErrorCode.RESOURCE_LIMIT, f"{name} ran past its {SIGNALS_OF_LIMITS[sig]} limit "
                                                            f"({limit}) and was stopped",
                                  "Do not repeat the call unchanged: give it less work.")
    stderr = exited.stderr_tail.decode(errors="replace").strip()
    if exited.returncode != 0:
        named = _named_error(exited.stdout)
        if named is not None:
            return named
        if NO_SPACE in stderr.lower():  # a tmpfs of its own filled up: only it could have filled it
            return ToolResult.failure(ErrorCode.RESOURCE_LIMIT, f"{name} filled its space (work directory "
                                      f"{limits.workdir_mb} MiB, /tmp and /dev/shm {limits.tmp_mb} MiB each): "
                                      f"{stderr[-MESSAGE_TAIL:]}", "Do not repeat the call unchanged: write less.")
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


def export_workdir(command: list[str], fd: int) -> list[str]:
    """``command``, then its work directory as a tar on ``fd``, from inside the sandbox (the directory is a
    tmpfs there: the host never sees it); the tool's exit status is kept."""
    script = f'"$@"; status=$?; tar -cf /proc/self/fd/{fd} -C {WORKDIR} . 2>/dev/null; exit $status'
    return ["/bin/sh", "-c", script, "agentfleet-keep", *command]


def _with_workdir(tool: Tool, read: Produced, kept: SideChannel, limits: ResourceLimits) -> Produced | ToolResult:
    """The call's output with its kept work directory (a gzipped tar) as an artifact, compressed from the spool
    file to another (never the whole tree in the worker's memory)."""
    if kept.overflowed:
        return ToolResult.failure(ErrorCode.RESOURCE_LIMIT, f"{tool.name} kept more than its work directory's "
                                  f"{limits.workdir_mb} MiB", "Keep fewer files.")
    spool = kept.sink
    spool.seek(0)
    packed = tempfile.TemporaryFile(prefix="agentfleet-artifact-")  # noqa: SIM115 - the store reads and closes it
    digest = hashlib.sha256()
    with gzip.GzipFile(fileobj=_Hashing(packed, digest), mode="wb", mtime=0) as gz:
        shutil.copyfileobj(spool, gz, COPY_CHUNK)
    size = packed.tell()
    packed.seek(0)
    ref = {"ref": f"sha256:{digest.hexdigest()}", "kind": "workdir", "size": size, "media_type": "application/gzip"}
    return Produced(read.value, read.encoded, (*read.artifacts, (ref, packed)))


@dataclass
class _Hashing:
    """A file that hashes what is written to it (the artifact's reference, without reading it back)."""

    file: Any
    digest: Any

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return int(self.file.write(data))

    def flush(self) -> None:
        self.file.flush()
