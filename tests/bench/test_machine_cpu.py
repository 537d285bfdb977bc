"""The throughput bench's split of the machine's CPU (``benchmarks.common.MachineCpu``) counts each process's CPU
from the moment it was made, in the right group. CPU time, not wall time: what is asserted is work done, not speed."""

from __future__ import annotations

import subprocess
import sys
import time

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
