"""The throughput bench's split of the machine's CPU (``benchmarks.common.MachineCpu``) counts each process's CPU
from the moment it was made, in the right group. CPU time, not wall time: what is asserted is work done, not speed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import MachineCpu

BURN = """
import sys, time
def burn(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
for line in sys.stdin:
    burn(0.3)
    print("burnt", flush=True)
"""


def test_a_workers_cpu_before_the_stretch_is_not_counted_and_its_cpu_in_it_is() -> None:
    worker = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.stdout.readline() == "burnt\n"  # 0.3 s of CPU before the stretch
        cpu = MachineCpu.of([worker.pid])
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.stdout.readline() == "burnt\n"  # 0.3 s in it
        end = time.process_time() + 0.2  # and 0.2 s of this process's own, the client's
        while time.process_time() < end:
            pass
        used = cpu.ms_per(1)
    finally:
        worker.kill()
        worker.wait()
    assert 280 <= used["workers"] <= 450, used  # one stretch's 300 ms, not both burns' 600
    assert used["client"] >= 180, used
    assert used["total"] >= used["workers"] + used["client"] - 40, used  # the machine's busy time holds both
    assert set(used) == {"workers", "rabbitmq", "postgres", "redis", "client", "rest", "total"}


WAITS = """
import sys, threading, time
def waits(n):
    for _ in range(n):
        time.sleep(0.001)
for line in sys.stdin:
    if line.startswith("thread"):
        t = threading.Thread(target=waits, args=(200,))
        t.start()
        t.join()
        print(t.native_id, flush=True)
    elif line.startswith("sleep"):
        waits(200)
    else:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
    print("done", flush=True)
"""


def test_a_process_is_counted_each_time_one_of_its_threads_waits_and_not_while_it_computes() -> None:
    from benchmarks.common import voluntary_switches

    child = subprocess.Popen([sys.executable, "-c", WAITS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None

    def counted(what: str) -> int:
        assert child.stdin is not None and child.stdout is not None
        before = voluntary_switches(child.pid)
        child.stdin.write(what + "\n")
        child.stdin.flush()
        if what == "thread":  # join() returns before the kernel has let the thread go: until then /proc lists it
            gone, deadline = Path(f"/proc/{child.pid}/task/{child.stdout.readline().strip()}"), time.monotonic() + 10
            while gone.exists():
                assert time.monotonic() < deadline, f"{gone} still listed"
                time.sleep(0.005)
        assert child.stdout.readline() == "done\n"
        return voluntary_switches(child.pid) - before

    try:
        assert 200 <= counted("sleep") <= 260  # 200 sleeps, and the reads of the line and the print around them
        assert counted("burn") <= 30  # 0.2 s of CPU, no wait but the line's read
        assert counted("thread") <= 30  # a thread that ended took its 200 with it: a lower bound, as documented
    finally:
        child.kill()
