"""One iteration's store work as the three roles do it, in one process, with no broker and no model
(``python -m benchmarks.store_iteration [ITERATIONS]``; figures in benchmarks/README.md, issue 23).

The same store calls, in the same transactions and order, as the planner (step lock, the run held, the move to the
next iteration, the intent, the transcript read, then the run held as read, the turn, the plan step's outcome, the
move to EXECUTING and the dedupe mark), the executor (step lock with the intent, outcome, mark) and the observer (the
result with the run held, the move to OBSERVING, the mark), on a scratch Postgres database. Prints the median wall
and CPU time of an iteration after the first fifth. The fleet's own figures move ±15% from one minute to the next on
this machine; this one moves less, so an A/B of a store change is run by alternating two trees
(``PYTHONPATH=<tree>``) many times, short runs.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import Message
from agentfleet.store import Store, make_engine
from agentfleet.store.db import scratch_database
from benchmarks.common import PG_ADMIN


def iterations(store: Store, n: int) -> tuple[float, float]:
    """Median wall and CPU ms of an iteration, the first fifth left out."""
    run_id = f"r-{uuid.uuid4().hex}"
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={"q": "x" * 200},
                         limits={})
    walls, cpus = [], []
    for it in range(n):
        wall, cpu = time.perf_counter(), time.thread_time()
        key, tool_key = f"{run_id}:{it}:plan", f"{run_id}:{it}:tool"
        with store.handling(), store.step_lock(key) as held:
            with store.tx() as conn:
                run = store.get_run(run_id, conn, lock=True)
                assert run is not None and held
                run = store.transition(conn, run, RunState.PLANNING, iteration=it)
                assert run is not None
                intent = store.intend_step(conn, key=key, run_id=run_id, iteration=it, kind="plan",
                                           input={"tools": ["t"]})
                read = store.history_later(run_id, conn)  # with the intent and the COMMIT
                store.relax(conn)
            assert intent().status == "started"
            read()
            with store.tx() as conn:
                current = store.hold_run(conn, run)  # as the first transaction left it: checked with the COMMIT
                assert current is not None
                store.write_messages(conn, run_id, [(it, 0, Message(role="assistant", content="ok " * 20))])
                store.finish_step(conn, key, status="succeeded", output={"calls": ["t"]}, duration_ms=0.1)
                store.transition(conn, current, RunState.EXECUTING, steps_used=current.steps_used + 1)
                store.mark_processed(conn, uuid.uuid4().hex, "planner", [{"x": 1}], run_id=run_id, deferred=True)
                store.release_held(conn)
        with store.handling(), store.step_lock(tool_key) as held:
            record = store.begin_step(key=tool_key, run_id=run_id, iteration=it, kind="tool", call_id="c", name="t",
                                      input={}, durable=False, hold=held)
            assert record is not None and held
            with store.tx() as conn:
                store.finish_step(conn, tool_key, status="succeeded", output={"ok": True}, duration_ms=0.1)
                store.mark_processed(conn, uuid.uuid4().hex, "executor", [{"x": 1}], run_id=run_id, deferred=True)
                store.release_held(conn)
        with store.handling(), store.tx() as conn:
            noted = store.observe_while(conn, run_id=run_id, iteration=it, states=[str(RunState.EXECUTING)],
                                        call_id="c", tool="t", result={"ok": True})
            current = store.get_run(run_id, conn, lock=True)
            assert current is not None and noted is not None and noted.rows().first() == (1, 1)
            store.transition(conn, current, RunState.OBSERVING)
            store.mark_processed(conn, uuid.uuid4().hex, "observer", [{"x": 1}], run_id=run_id, deferred=True)
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.thread_time() - cpu) * 1000)
    skip = n // 5
    return statistics.median(walls[skip:]), statistics.median(cpus[skip:])


def main(n: int = 150) -> None:
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url:
        engine = make_engine(url)
        try:
            wall, cpu = iterations(Store(engine, audit=True), n)
        finally:
            engine.dispose()
    print(f"{n} iterations: wall {wall:.3f} ms, CPU {cpu:.3f} ms an iteration (median)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
