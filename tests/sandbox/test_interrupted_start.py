"""A sandboxed call interrupted at any moment of its start (its worker killed, the call cancelled) leaves no
process behind.

bubblewrap's ``--die-with-parent`` binds each of its processes to its parent only once
that process has called ``prctl``: the outer process after it has cloned the sandbox,
the sandbox's init after the sandbox is built. A worker (or the outer process, stopped
by a cancel) gone between those moments left the sandbox's init alive with the tool in
it, for as long as the tool ran (CI: a 90 s nap outlived its killed executor, another its
cancelled run). Here a real call is interrupted at each of those moments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import eventually, processes_with, require_sandbox

ROOT = Path(__file__).resolve().parents[2]
MARKER = "agentfleet-test-mid-start"

WORKER = f"""
import sys
from pathlib import Path
from agentfleet.harness import run_tool
from agentfleet.tools.manifest import subprocess_tool
from tests.helpers import call_ctx
sleeper = subprocess_tool("sleeper", ["python3", "-c", "import time; time.sleep(120)  # {MARKER}"],
                          description="sleeps",
                          schema={{"type": "object"}}, timeout_s=120)
run_tool(sleeper, {{}}, call_ctx(Path(sys.argv[1])), 120)
"""


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    require_sandbox()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _bubblewrap_started(worker: int) -> int | None:
    """bubblewrap's outer process for the call (not the probe of bubblewrap before it), not yet bound to the
    worker."""
    return next((c for c in _children(worker) if _cmdline(c).startswith(b"bwrap\x00")
                 and MARKER.encode() in _cmdline(c)), None)


def _sandbox_cloned(worker: int) -> int | None:
    """The sandbox's first process, cloned by the outer one and building the sandbox (not yet bound to it)."""
    outer = _bubblewrap_started(worker)
    return next(iter(_children(outer)), None) if outer else None


def _sandbox_built(worker: int) -> int | None:
    """The sandbox's first process in a session of its own: built, about to become the sandbox's init (still not
    bound to its parent, and out of reach of a signal to the outer process's group)."""
    inner = _sandbox_cloned(worker)
    if inner is None:
        return None
    try:
        session = int(Path(f"/proc/{inner}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None
    return inner if session == inner else None


def _tool_running(worker: int) -> int | None:
    return next((p for p in processes_with(MARKER) if _cmdline(p).startswith(b"python3\x00")), None)


@pytest.mark.parametrize("moment", [_bubblewrap_started, _sandbox_cloned, _sandbox_built, _tool_running],
                         ids=["bubblewrap-started", "sandbox-cloned", "sandbox-built", "tool-running"])
def test_a_worker_killed_at_this_moment_of_a_calls_start_leaves_no_process_of_it(tmp_path: Path, moment) -> None:
    """The process of that moment is held (SIGSTOP: a scheduler may hold any process that long on a busy host)
    while the worker is killed, then let go."""
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    held = None
    try:
        deadline = time.monotonic() + 30
        while (held := moment(worker.pid)) is None:  # polled without sleeping: the moments last milliseconds
            assert worker.poll() is None and time.monotonic() < deadline, f"{moment.__name__} never came"
        os.kill(held, signal.SIGSTOP)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        # The held process may already be gone: the sandbox's init, bound to its parent, ends with the worker and
        # takes every process of its namespace with it (a stopped one too), as it should.
        with contextlib.suppress(ProcessLookupError):
            os.kill(held, signal.SIGCONT)
        eventually(lambda: not processes_with(MARKER), timeout=5,
                   message=f"the call outlived its worker, killed at {moment.__name__}")
    finally:
        if worker.poll() is None:
            worker.kill()
        for pid in processes_with(MARKER):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("cgroups", [True, False], ids=["with-cgroups", "without-cgroups"])
@pytest.mark.parametrize("moment", [_sandbox_cloned, _sandbox_built], ids=["sandbox-cloned", "sandbox-built"])
def test_a_call_cancelled_while_its_sandbox_is_being_built_leaves_no_process_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cgroups: bool, moment) -> None:
    """The cancel stops bubblewrap's outer process while the sandbox's first process is still building it. Where
    the host offers cgroups, the call's is emptied when it ends; on a host without them nothing else would be."""
    from agentfleet import ToolContext
    from agentfleet.errors import ErrorCode
    from agentfleet.harness import run_tool
    from agentfleet.sandbox import call_bounds
    from agentfleet.tools.manifest import subprocess_tool

    if not cgroups:
        host = call_bounds.host_bounds()
        monkeypatch.setattr(call_bounds, "_host", dataclasses.replace(host, cgroups=None,
                                                                      cgroups_why_not="taken away by the test"))

    cancelled = threading.Event()
    call = ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=tmp_path.resolve(),
                       cancel_check=cancelled.is_set)
    sleeper = subprocess_tool("sleeper", ["python3", "-c", f"import time; time.sleep(120)  # {MARKER}"],
                              description="sleeps", schema={"type": "object"}, timeout_s=120)
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(run_tool, sleeper, {}, call, 120)
        held = None
        try:
            deadline = time.monotonic() + 30
            while (held := moment(os.getpid())) is None:
                assert not done.done() and time.monotonic() < deadline, f"{moment.__name__} never came"
            os.kill(held, signal.SIGSTOP)
            cancelled.set()
            assert done.result(timeout=30).error_code == ErrorCode.CANCELLED
            os.kill(held, signal.SIGCONT)
            eventually(lambda: not processes_with(MARKER), timeout=5, message="the call outlived its cancel")
        finally:
            cancelled.set()
            if held is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(held, signal.SIGCONT)
            for pid in processes_with(MARKER):
                os.kill(pid, signal.SIGKILL)


def test_a_tool_cannot_hold_its_lifeline_open_for_writing(tmp_path: Path) -> None:
    """The guard's EOF is the worker's word that the call is over: a tool that opened a write end of its lifeline
    (by its path, /proc/self/fd/N, as the events pipe is opened) would keep it from ever coming. Every pipe the
    tool was given to read, it may only read."""
    from agentfleet.harness import run_tool
    from agentfleet.tools.manifest import subprocess_tool
    from tests.helpers import call_ctx

    grab = ("import json, os\nopened = []\nfor fd in os.listdir('/proc/self/fd'):\n"
            " try:\n  target = os.readlink(f'/proc/self/fd/{fd}')\n"
            "  flags = int(open(f'/proc/self/fdinfo/{fd}').read().split('flags:')[1].split()[0], 8)\n"
            " except OSError:\n  continue\n"
            " if target.startswith('pipe:') and flags & 3 == 0:\n"
            "  try:\n   os.open(f'/proc/self/fd/{fd}', os.O_WRONLY | os.O_NONBLOCK)\n   opened.append(fd)\n"
            "  except OSError:\n   pass\n"
            "print(json.dumps(opened))")
    grabber = subprocess_tool("grabber", ["python3", "-c", grab], description="opens what it reads for writing",
                              schema={"type": "object"}, timeout_s=20)
    result = run_tool(grabber, {}, call_ctx(tmp_path), 20)
    assert result.ok and result.output == [], result
