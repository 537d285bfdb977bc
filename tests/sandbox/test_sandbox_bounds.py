"""Bounds per call, never per host (issue "Containment", cases 1, 3, 4, 5 and 6): real processes under the real
bubblewrap, each hostile call beside ordinary calls that must all succeed."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentfleet import ToolContext
from agentfleet.errors import ConfigurationError, ErrorCode
from agentfleet.harness import run_tool
from agentfleet.loop.transcript import ToolResult
from agentfleet.sandbox.call_bounds import host_bounds, private_directory
from agentfleet.sandbox.options import ResourceLimits, Sandbox
from agentfleet.tools.manifest import load_tool_manifest, subprocess_tool
from agentfleet.tools.tool import Tool
from tests.helpers import call_ctx, require_sandbox

EXAMPLES = Path(__file__).resolve().parents[2] / "agentfleet" / "examples" / "polyglot" / "tools"


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    require_sandbox()


def needs_cgroups() -> None:
    bounds = host_bounds()
    if bounds.cgroups is None:
        if os.environ.get("CI"):
            pytest.fail(f"this machine offers cgroups to root, and the fleet could not use them: "
                        f"{bounds.cgroups_why_not}")
        pytest.skip(bounds.cgroups_why_not)


def ctx(tmp_path: Path, call_id: str = "c") -> ToolContext:
    return call_ctx(tmp_path, call_id)


def sh(name: str, script: str, **options: Any) -> Tool:
    return subprocess_tool(name, ["bash", "-c", script], description=f"{name} (test)", schema={"type": "object"},
                           **options)


def ordinary(n: int) -> Tool:
    return sh(f"ordinary{n}", "sleep 0.3; echo '{\"ok\": true}'")


def beside(tmp_path: Path, hostile: Tool, others: int = 8, *, delay_s: float = 0.3) -> tuple[ToolResult,
                                                                                                list[ToolResult]]:
    """Run ``hostile`` and, once it has started, ``others`` ordinary calls at the same time."""
    with ThreadPoolExecutor(max_workers=others + 1) as pool:
        first = pool.submit(run_tool, hostile, {}, ctx(tmp_path, "hostile"), 30)
        time.sleep(delay_s)
        rest = [pool.submit(run_tool, ordinary(i), {}, ctx(tmp_path, f"o{i}"), 30) for i in range(others)]
        return first.result(), [f.result() for f in rest]


def test_a_call_holding_sixty_processes_leaves_every_other_call_alone(tmp_path: Path) -> None:
    """Was: every call ran as nobody, RLIMIT_NPROC counted them all, and eight ordinary calls failed
    'bwrap: Creating new namespace failed' while one tool held 60 processes within its own limit."""
    many = sh("many", "for i in $(seq 60); do sleep 2 & done; wait; echo '{\"held\": 60}'",
              sandbox=Sandbox(limits=ResourceLimits(processes=64)))
    hostile, others = beside(tmp_path, many)
    assert hostile.ok, hostile
    assert all(r.ok for r in others), [r.message for r in others if not r.ok]


def test_twelve_node_calls_at_once_all_succeed(tmp_path: Path) -> None:
    node = load_tool_manifest(EXAMPLES / "word_count_node.tool.toml")
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda i: run_tool(node, {"text": f"one two {i}"}, ctx(tmp_path, f"n{i}"), 30),
                                range(12)))
    assert all(r.ok for r in results), [r.message for r in results if not r.ok]


def test_a_fork_bomb_ends_resource_limit_and_the_others_never_notice(tmp_path: Path) -> None:
    needs_cgroups()
    bomb = sh("bomb", "b() { b | b & }; b; sleep 5", timeout_s=4, sandbox=Sandbox(limits=ResourceLimits(processes=32)))
    hostile, others = beside(tmp_path, bomb, delay_s=0.5)
    assert hostile.error_code == ErrorCode.RESOURCE_LIMIT and "processes" in (hostile.message or ""), hostile
    assert all(r.ok for r in others), [r.message for r in others if not r.ok]


def test_memory_is_bounded_for_all_of_a_calls_processes_together(tmp_path: Path) -> None:
    """Was: three processes of 800 MB each passed a 1 GiB cap that was per process."""
    needs_cgroups()
    three = subprocess_tool("three", ["python3", "-c", textwrap.dedent("""
        import subprocess, sys
        hold = "b = bytearray(800 << 20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(3)"
        procs = [subprocess.Popen([sys.executable, "-c", hold]) for _ in range(3)]
        print([p.wait() for p in procs])
    """)], description="three big processes", schema={"type": "object"}, timeout_s=20,
        sandbox=Sandbox(limits=ResourceLimits(memory_mb=1024)))
    hostile, others = beside(tmp_path, three, delay_s=0.5)
    assert hostile.error_code == ErrorCode.RESOURCE_LIMIT and "memory" in (hostile.message or ""), hostile
    assert all(r.ok for r in others), [r.message for r in others if not r.ok]


@pytest.mark.parametrize("where", ["/dev/shm/fill", "/sandbox/work/fill", "/tmp/fill"])
def test_shared_memory_the_work_directory_and_tmp_are_each_bounded_per_call(tmp_path: Path, where: str) -> None:
    """Was: 1.9 GB written to /dev/shm with tmp_mb 64, and 1.43 GB to the work directory with no quota."""
    filler = sh("filler", f"set -e; head -c 40000000 /dev/zero > {where}; echo '{{}}'",
                sandbox=Sandbox(limits=ResourceLimits(tmp_mb=8, workdir_mb=16)))
    hostile, others = beside(tmp_path, filler, others=4, delay_s=0.05)
    assert hostile.error_code == ErrorCode.RESOURCE_LIMIT and "filled its space" in (hostile.message or ""), hostile
    assert all(r.ok for r in others)


def test_secret_values_never_appear_on_a_command_line(tmp_path: Path) -> None:
    """Was: env= and pass_env values were bubblewrap arguments, which ps shows every local user."""
    os.environ["AGENTFLEET_TEST_PASSED_SECRET"] = "passed-canary-7f3a"
    try:
        slow = sh("slow", "sleep 1.5; echo \"{\\\"n\\\": ${#API_TOKEN}}\"",
                  sandbox=Sandbox(env={"API_TOKEN": "set-canary-91c2"}, pass_env=("AGENTFLEET_TEST_PASSED_SECRET",)))
        seen: list[str] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                for pid in os.listdir("/proc"):
                    if pid.isdigit():
                        with contextlib.suppress(OSError):
                            seen.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            result = run_tool(slow, {}, ctx(tmp_path), 10)
        finally:
            done.set()
            watcher.join()
    finally:
        del os.environ["AGENTFLEET_TEST_PASSED_SECRET"]
    assert result.ok and result.output == {"n": len("set-canary-91c2")}, result
    assert any("bwrap" in line for line in seen)  # the watcher saw the sandbox running
    assert not [line for line in seen if "canary-" in line]


def test_a_sandboxed_python_tool_of_a_project_under_tmp_runs(tmp_path: Path) -> None:
    """Was: the sandbox's private /tmp hid the mounted package: every call ModuleNotFoundError."""
    import shutil
    import tempfile

    project = Path(tempfile.mkdtemp(prefix="agentfleet-project-", dir="/tmp"))  # readable as a checkout is
    os.chmod(project, 0o755)
    try:
        _run_a_tool_of(project, tmp_path)
    finally:
        shutil.rmtree(project)


def _run_a_tool_of(project: Path, tmp_path: Path) -> None:
    package = project / "proj_under_tmp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(textwrap.dedent("""
        from agentfleet import tool

        @tool(sandbox=True)
        def shout(word: str) -> dict:
            \"\"\"Shout a word.\"\"\"
            return {"said": word.upper()}
    """))
    for path in (package, package / "__init__.py", package / "tools.py"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    sys.path.insert(0, str(project))
    try:
        from proj_under_tmp.tools import shout  # type: ignore[import-not-found]

        result = run_tool(shout, {"word": "hi"}, ctx(tmp_path), 20)
    finally:
        sys.path.remove(str(project))
    assert result.ok and result.output == {"said": "HI"}, result


def test_running_outside_the_sandbox_can_no_longer_be_asked_for() -> None:
    """Was: required=false ran a tool with the worker's view: it read /proc/$PPID/environ (the API key, the
    database URL) and a setsid grandchild outlived the call."""
    with pytest.raises(ConfigurationError, match="required = false is no longer accepted"):
        sh("bare", "true", sandbox={"required": False})


def test_the_uid_pool_directory_is_refused_when_it_is_a_link_or_anothers(tmp_path: Path) -> None:
    """Was: $TMPDIR/agentfleet-calls replaced by a symlink made the root worker chmod the link's target."""
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    link = tmp_path / "pool"
    link.symlink_to(target)
    with pytest.raises(OSError, match="not a private directory"):
        private_directory(link)
    assert oct(target.stat().st_mode & 0o777) == "0o755"  # untouched
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    with pytest.raises(OSError, match="not a private directory"):
        private_directory(open_dir)
    assert private_directory(tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


def test_health_says_how_each_bound_is_enforced_here() -> None:
    said = host_bounds().describe()
    assert set(said) >= {"processes", "memory", "work directory", "/tmp", "/dev/shm"}
    if os.geteuid() == 0:
        assert "a uid of its own per call" in said["processes"]


def test_call_groups_a_killed_worker_left_are_emptied_and_removed_by_the_next_and_no_live_ones(tmp_path: Path) -> None:
    """Was: a worker killed mid-call (a kill, an OOM, a deploy) left its call's cgroup behind, one in every hierarchy:
    97 on this machine after one day of tests. The next worker on the host sweeps those whose worker is gone (their
    processes killed first); a running worker's groups are never touched."""
    import subprocess

    from agentfleet.sandbox.call_bounds import CallGroup, detect_cgroups
    from tests.helpers import eventually

    needs_cgroups()
    cgroups = detect_cgroups()
    assert not isinstance(cgroups, str), cgroups
    # A worker that makes its call's group, puts a process of the call in it and is SIGKILLed: nothing closes it.
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, signal, subprocess
        from agentfleet.sandbox.call_bounds import detect_cgroups
        group = detect_cgroups().make("stale", (8, 64 << 20))
        straggler = subprocess.Popen(["sleep", "300"], preexec_fn=group.join, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        print(straggler.pid, *group.dirs, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = worker.communicate(timeout=30)
    assert out, err
    pid, *dirs = out.split()
    stale = CallGroup(tuple(Path(d) for d in dirs), cgroups.version)
    straggler_pid = int(pid)
    try:
        assert worker.returncode == -signal.SIGKILL and all(d.exists() for d in stale.dirs)
        assert all(straggler_pid in [int(p) for p in (d / "cgroup.procs").read_text().split()] for d in stale.dirs)
        live = cgroups.make("live", (8, 64 << 20))  # this process's own call, running
        try:
            assert cgroups.sweep() >= 1
            eventually(lambda: not Path(f"/proc/{straggler_pid}").exists()
                       or Path(f"/proc/{straggler_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
                       timeout=5, message="the dead worker's straggler lives on")
            assert not any(d.exists() for d in stale.dirs)
            assert all(d.exists() for d in live.dirs)
        finally:
            live.close()
    finally:
        stale.close()
