"""What one planner read of a run's transcript costs as the run grows: the whole transcript against only what is
new (``python -m benchmarks.transcript_read``; figures in benchmarks/README.md, issue 23).

A scratch Postgres database; a run of ``ITERATIONS`` iterations, each appending a ~1,000-token turn and the last
turn's ~1,000-token result as the planner does; after each, one read by the store that keeps complete iterations
and one by a store with nothing kept (the whole transcript, as every read was before). Both must agree.
"""

from __future__ import annotations

import statistics
import time

from agentfleet.loop.transcript import Message
from agentfleet.store import Store, make_engine
from agentfleet.store.db import scratch_database
from benchmarks.common import PG_ADMIN

ITERATIONS = 200
TEXT = "x" * 4000  # about 1,000 tokens


def main() -> None:
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url:
        engine = make_engine(url)
        kept = Store(engine)
        with kept.tx() as conn:
            kept.create_run(conn, run_id="r", agent="a", goal_id="g", trace_id="t", input={}, limits={})
        whole, new = [], []
        for i in range(ITERATIONS):
            with kept.tx() as conn:
                if i:
                    kept.append_messages(conn, "r", i - 1, [Message(role="tool", tool_call_id=f"c{i}", content=TEXT)],
                                         start=1)
                kept.append_messages(conn, "r", i, [Message(role="assistant", content=TEXT)])
            started = time.perf_counter()
            read = kept.transcript("r")
            new.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            assert Store(engine).transcript("r") == read
            whole.append((time.perf_counter() - started) * 1000)
        engine.dispose()
    tenth = ITERATIONS // 10
    for name, samples in (("whole transcript", whole), ("new rows only", new)):
        print(f"{name}: median {statistics.median(samples[:tenth]):.2f} ms over the first {tenth} iterations, "
              f"{statistics.median(samples[-tenth:]):.2f} ms over the last {tenth}")


if __name__ == "__main__":
    main()
