"""The sandbox side of declaring a tool: the check every sandboxed tool shares by default, and the command
that runs a Python tool in the sandbox.

A Python tool that opts in to the sandbox (``@tool(sandbox=Sandbox(...))``) runs as a subprocess tool.

The executor starts ``python -m agentfleet.harness.sandbox_child module:name`` under
bubblewrap like any subprocess tool: arguments on stdin, the result on stdout, killed
at its timeout or when its run is cancelled, instead of a thread abandoned in the
executor. What the sandbox shows it, read-only: the interpreter, the site-packages
directories, and the top-level packages of agentfleet and of the tool's own module
(not the project around them, the workspace or the worker's home).

The child's side (import the tool, run it on stdin, print its result) is
``sandbox_child``. The tool's module is imported again in the child, with the sandbox's cleared
environment: keep sandboxed tools in modules that import without secrets (a module
declaring an agent whose model needs an API key would fail there).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentfleet.errors import ConfigurationError
from agentfleet.sandbox.bwrap import sandbox_ready
from agentfleet.sandbox.options import Sandbox
from agentfleet.tools.health import HealthCheck, health_check

SANDBOX_CHECK = "sandbox"  # the health check sandboxed tools share: can bubblewrap run here?


ENTRY = "agentfleet.harness.sandbox_child"  # what the sandboxed process runs (python -m)


def sandbox_check() -> HealthCheck:
    """The health check every sandboxed tool shares by default: can bubblewrap build a sandbox here?"""
    return health_check(SANDBOX_CHECK, sandbox_ready, tier="local", timeout_s=10)


def python_argv_and_sandbox(fn: Callable[..., Any], tool_name: str, sandbox: Sandbox) -> tuple[list[str], Sandbox]:
    """The command that runs ``fn`` in a child, and ``sandbox`` widened by what that child must read."""
    module, name = fn.__module__, fn.__name__
    if "<locals>" in fn.__qualname__ or module == "__main__":
        raise ConfigurationError(f"tool {tool_name!r}: a sandboxed Python tool must be a module-level function of "
                                 "an importable module (the sandbox imports it again)")
    interpreter = _interpreter(tool_name)
    packages = {_package_dir(module.split(".")[0], tool_name), _package_dir("agentfleet", tool_name)}
    site = [p for p in map(os.path.realpath, sys.path) if p.endswith(("site-packages", "dist-packages"))
            and os.path.isdir(p) and not p.startswith("/usr/")]
    import_roots = sorted({str(Path(p).parent) for p in packages} | set(site))
    widened = sandbox.model_copy(update={
        "read_only": tuple(dict.fromkeys((*sandbox.read_only, *sorted(packages), *site))),
        "env": {**sandbox.env, "PYTHONPATH": ":".join(import_roots), "PYTHONDONTWRITEBYTECODE": "1"},
    })
    return [interpreter, "-s", "-m", ENTRY, f"{module}:{name}"], widened


def _interpreter(tool_name: str) -> str:
    """This interpreter if the sandbox user can read it, else the system's Python of the same version."""
    here = os.path.realpath(sys.executable)
    if here.startswith("/usr/") or _world_readable(here, sys.base_prefix):
        return here
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        raise ConfigurationError(f"tool {tool_name!r}: this interpreter ({here}) is not readable by the sandbox "
                                 f"user, and there is no {version} in /usr; install Python where every user can "
                                 "read it, or run the worker as a user who can")
    return system


def _world_readable(*paths: str) -> bool:
    for path in paths:
        p = Path(path)
        for d in [*reversed(p.parents), p]:
            try:
                mode = d.stat().st_mode
            except OSError:
                return False
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                return False
    return True


def _package_dir(top: str, tool_name: str) -> str:
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ConfigurationError(f"tool {tool_name!r}: cannot find module {top!r} to show it to the sandbox")
    if spec.submodule_search_locations:
        return os.path.realpath(next(iter(spec.submodule_search_locations)))
    if spec.origin is None:
        raise ConfigurationError(f"tool {tool_name!r}: module {top!r} has no file to show to the sandbox")
    return os.path.realpath(spec.origin)
