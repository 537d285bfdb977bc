"""How long batches of events wait for the broker's confirms when several threads publish at once, as a worker's
pool does (``python -m benchmarks.confirm_batches``; figures in benchmarks/README.md, issue 23).

``THREADS`` threads, each publishing ``BATCHES`` batches of one to four events through the fleet's own ``Publisher``
(a private namespace on the real broker, its queues declared, deleted after). Before eba20ec a confirm that py-amqp
read while a batch was still being sent was lost to the batch's wait, which then waited ``CONFIRM_TIMEOUT_S`` (30 s)
and sent the batch again: the slowest batch shows it.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid

from agentfleet.config.settings import Settings
from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.events.publisher import Publisher
from agentfleet.events.topology import Topology
from agentfleet.workers.app import create_app
from benchmarks.common import BROKER

THREADS = 6
BATCHES = 40


def main() -> None:
    namespace = f"afbench-{uuid.uuid4().hex[:8]}"
    app = create_app(Settings(profile="distributed", broker_url=BROKER, namespace=namespace))
    topology = Topology(namespace)
    with app.connection_for_write() as conn:
        topology.declare(conn)
    publisher = Publisher(app, topology)
    waits: list[float] = []
    guard = threading.Lock()

    def send(thread: int) -> None:
        for i in range(BATCHES):
            batch = [Envelope.new(EventType.RUN_CANCEL_REQUESTED, f"r-{thread}-{i}", RunCancelRequested(reason="b"),
                                  trace_id="t") for _ in range(1 + i % 4)]
            started = time.perf_counter()
            publisher.publish(batch)
            with guard:
                waits.append((time.perf_counter() - started) * 1000)

    try:
        started = time.perf_counter()
        threads = [threading.Thread(target=send, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = time.perf_counter() - started
    finally:
        with app.connection_for_write() as conn:
            topology.delete(conn)
    waits.sort()
    print(f"{len(waits)} batches from {THREADS} threads in {total:.2f} s: median {statistics.median(waits):.1f} ms, "
          f"p99 {waits[int(len(waits) * 0.99) - 1]:.1f} ms, slowest {waits[-1]:.1f} ms, "
          f"over 1 s: {sum(w > 1000 for w in waits)}")


if __name__ == "__main__":
    main()
