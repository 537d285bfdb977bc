"""Many runs parked on approvals: what the workers and the database hold while people decide.

Each run's one tool call needs a person (``gated``), so it is parked: a row in ``approvals``, the
run in WAITING_APPROVAL, nothing in any queue and no worker slot held. Worker memory after parking
is compared with before (the in-flight suite's method: in two halves, so memory held per run would
show as growth in the second). Then every request is approved, as fast as one client can answer,
and the time until all runs have ended is measured.
"""

from __future__ import annotations

import time

from agentfleet.events.contracts import ApprovalResolve
from agentfleet.loop.states import RunState
from agentfleet.roles.approvals import resolve
from agentfleet.roles.runtime import runtime_for
from agentfleet.workers.app import create_app
from benchmarks.common import ONE_EACH, Fleet, Report, Sizes, fleet, wait_until
from benchmarks.suites.in_flight import add_parked_figures, database_bytes, queue_depth, worker_rss

SUITE = "approvals"
GATED = {"iterations": 2, "gated": True}


def approve_all(f: Fleet, rt: object, run_ids: list[str]) -> None:
    for run_id in run_ids:
        resolve(rt, ApprovalResolve(run_id=run_id, call_id="n", decision="approve"), "bench")  # type: ignore[arg-type]


def run(sizes: Sizes, report: Report) -> None:
    total = sizes.approval_runs
    halves = (total // 2, total - total // 2)
    waiting = f"SELECT count(*) FROM runs WHERE state = '{RunState.WAITING_APPROVAL.value}'"
    with fleet(ONE_EACH) as f:
        rt = runtime_for(create_app(f.settings))
        for _ in range(3):  # warm-up: every code path a parked and answered run takes, before the baseline
            (run_id,) = f.submit("bench_loop", [GATED])
            wait_until(lambda r=run_id: f.count(waiting + " AND run_id = :r", r=r) == 1, "a run to park", 60)
            approve_all(f, rt, [run_id])
            f.wait(run_id, 60)
        rss, db = [worker_rss(f)], [database_bytes(f)]
        park_s, parked = 0.0, []
        for n, target in zip(halves, (halves[0], total), strict=True):
            t0 = time.monotonic()
            parked += f.submit("bench_loop", [GATED] * n)
            wait_until(lambda t=target: f.count(waiting) == t, f"{target} runs to park", timeout=120 + n * 0.2,
                       interval=0.5)
            park_s += time.monotonic() - t0
            time.sleep(2)  # let the last handlers return before reading memory
            rss.append(worker_rss(f))
            db.append(database_bytes(f))
        queued = sum(queue_depth(f, role) for role in ONE_EACH)
        t0 = time.monotonic()
        approve_all(f, rt, parked)
        answer_s = time.monotonic() - t0
        ended = "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED' AND run_id = ANY(:ids)"
        wait_until(lambda: f.count(ended, ids=parked) == total, "every approved run to end", timeout=120 + total * 0.2,
                   interval=0.5)
        resume_s = time.monotonic() - t0
        done = f.count(ended, ids=parked)

    report.add(SUITE, "parked_runs", total)
    report.add(SUITE, "seconds_to_park", round(park_s, 1), f"{park_s:.1f} s ({total / park_s:.0f} runs/s)")
    report.add(SUITE, "messages_queued_while_parked", queued)
    add_parked_figures(report, SUITE, rss, db, halves)
    report.add(SUITE, "seconds_to_answer_all", round(answer_s, 1), f"{answer_s:.1f} s ({total / answer_s:.0f}/s, "
                                                                   "one client)")
    report.add(SUITE, "seconds_until_all_ended", round(resume_s, 1), f"{resume_s:.1f} s ({total / resume_s:.0f} "
                                                                     "runs/s resumed and finished)")
    report.add(SUITE, "runs_ended_after_approval", done)
