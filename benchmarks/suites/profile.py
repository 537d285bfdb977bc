"""Where an iteration's CPU goes: py-spy samples each role's worker process during a long loop run.

py-spy (from the peers' environment) attaches from outside, so the workers run unmodified.
Idle threads (waiting on a socket, the broker or the pool) are not sampled: the shares are
of CPU time. The CPU each process used is read from /proc, for the sampled run and for the
same run before it with nothing attached: py-spy pauses a process to sample it, which added a
little on one machine and twice the fleet's own CPU on another, so both are reported. Each
role's samples are split three ways: by the package whose code was on CPU; by the innermost
agentfleet function on the stack (the call site in our code that led there, so a psycopg
sample under ``Store.step_lock`` counts for ``step_lock``); and by the function on CPU.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

from benchmarks.common import ONE_EACH, Report, Sizes, cpu_ms_per_iteration, fleet, role_cpu_s
from benchmarks.peers import venv_bin

SUITE = "profile"
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]+)(?::\d+)?\)$")
PACKAGES = ("agentfleet", "sqlalchemy", "psycopg", "kombu", "amqp", "celery", "pydantic", "pydantic_core",
            "jsonschema", "billiard", "vine", "json", "logging", "threading", "socket", "ssl", "uuid", "datetime")
TOP = 10


def frames(stack: str) -> list[tuple[str, str]]:
    """``a (f.py:1);b (g.py:2)`` → [(a, f.py), (b, g.py)], outermost first."""
    out = []
    for part in stack.split(";"):
        m = FRAME.match(part)
        if m:
            out.append((m["func"], m["file"]))
    return out


def package(file: str) -> str:
    parts = Path(file).with_suffix("").parts
    for name in PACKAGES:
        if name in parts:
            return name
    return "other (stdlib, interpreter)"


def summarise(raw: str) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    """Total samples; samples by the package on CPU, by innermost agentfleet function, by function on CPU."""
    total, by_package, by_site, by_leaf = 0, Counter[str](), Counter[str](), Counter[str]()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        stack_frames = frames(stack)
        if not stack_frames:
            continue
        total += n
        leaf_func, leaf_file = stack_frames[-1]
        by_package[package(leaf_file)] += n
        by_leaf[f"{Path(leaf_file).with_suffix('').name}.{leaf_func}"] += n
        ours = [(func, file) for func, file in stack_frames
                if "agentfleet" in Path(file).parts and Path(file).name != "cli.py"]  # cli.py: the worker's main
        if ours:
            func, file = ours[-1]
            by_site[f"{Path(file).with_suffix('').name}.{func}"] += n
        else:
            by_site["(no agentfleet frame: Celery's consumer loop, broker I/O)"] += n
    return total, by_package, by_site, by_leaf


def run(sizes: Sizes, report: Report) -> None:
    spy = venv_bin("py-spy")
    with fleet(ONE_EACH) as f:
        f.run("bench_loop", {"iterations": 5})
        pids = {role: f.pids(role)[0] for role in ONE_EACH}
        # The same run's CPU with no sampler attached: py-spy's pauses cost the workers' event loops more on some
        # machines than on others (three times the CPU on one), and the shares below are only worth as much as this.
        before = role_cpu_s(f)
        f.run("bench_loop", {"iterations": sizes.profile_iterations})
        unsampled = cpu_ms_per_iteration(before, role_cpu_s(f), sizes.profile_iterations)["total"]
        outputs = {role: f.workspace / f"{role}.pyspy" for role in ONE_EACH}
        spies = [subprocess.Popen([str(spy), "record", "--pid", str(pids[role]), "--gil", "--rate", "250", "--format",
                                   "raw", "--output", str(path), "--duration", "3600"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for role, path in outputs.items()]
        before = role_cpu_s(f)
        try:
            f.run("bench_loop", {"iterations": sizes.profile_iterations})
            cpu_ms = cpu_ms_per_iteration(before, role_cpu_s(f), sizes.profile_iterations)
        finally:
            for p in spies:
                p.send_signal(signal.SIGINT)
            for p in spies:
                _, stderr = p.communicate(timeout=60)
                if p.returncode not in (0, -signal.SIGINT):
                    raise RuntimeError(f"py-spy failed ({p.returncode}): {stderr.decode(errors='replace')[-2000:]}")
        raws = {role: path.read_text() if path.exists() else "" for role, path in outputs.items()}

    fleet_ms: Counter[str] = Counter()  # CPU ms per iteration by call site, the three roles together
    for role, raw in raws.items():
        total, by_package, by_site, by_leaf = summarise(raw)
        if not total:
            raise RuntimeError(f"py-spy took no samples of the {role}")
        ms = cpu_ms[role]
        for site, n in by_site.items():
            fleet_ms[site] += ms * n / total
        report.add(SUITE, f"{role}_cpu_ms_per_iteration", ms)
        report.add(SUITE, f"{role}_cpu_by_package", {k: round(v / total, 3) for k, v in by_package.most_common(TOP)},
                   ", ".join(f"{k} {v / total:.0%}" for k, v in by_package.most_common(TOP)))
        report.add(SUITE, f"{role}_cpu_by_agentfleet_call_site",
                   {k: round(v / total, 3) for k, v in by_site.most_common(TOP)},
                   ", ".join(f"{k} {v / total:.0%}" for k, v in by_site.most_common(TOP)))
        report.add(SUITE, f"{role}_cpu_by_function", {k: round(v / total, 3) for k, v in by_leaf.most_common(TOP)},
                   ", ".join(f"{k} {v / total:.0%}" for k, v in by_leaf.most_common(TOP)))
    sampled = cpu_ms["total"]
    report.add(SUITE, "worker_cpu_ms_per_iteration_unsampled", unsampled,
               f"{unsampled:.2f} ms (the same run with py-spy attached: {sampled:.2f})")
    report.add(SUITE, "sampled_over_unsampled", round(sampled / unsampled, 2),
               f"{sampled / unsampled:.2f}× (far above 1: the sampler, not the fleet, spent the difference)")
    report.add(SUITE, "all_roles_cpu_ms_per_iteration_by_call_site",
               {k: round(v, 2) for k, v in fleet_ms.most_common(TOP)},
               ", ".join(f"{k} {v:.2f} ms" for k, v in fleet_ms.most_common(TOP)))
