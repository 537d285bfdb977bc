"""What one page of the sweeper's scan costs beside a million ended runs (``python -m benchmarks.sweep_scan``;
figures in benchmarks/README.md, issue 23).

A scratch Postgres database holds ``ENDED`` ended runs (changed over the last two days, each with its Result
delivered to a reply_to) and ``LIVE`` live ones gone quiet an hour ago; one page of ``PAGE`` quiet runs is read
three times by the store (live runs through their own partial index, ended runs owing a Result beside them), and
three times by the single query the sweeper ran before (every run ordered by its last change, filtered). Both must
find the same runs.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

from sqlalchemy import select, text

from agentfleet.store import Store, make_engine
from agentfleet.store import tables as T
from agentfleet.store.db import scratch_database
from agentfleet.store.records import LIVE, RunRecord, now
from benchmarks.common import PG_ADMIN

ENDED, LIVE_RUNS, PAGE = 1_000_000, 100, 50
COLUMNS = ("run_id, agent, goal_id, trace_id, state, version, iteration, input, limits, steps_used, input_tokens, "
           "output_tokens, cost_usd, created_at, updated_at, redrives")


def main() -> None:
    with scratch_database(PG_ADMIN, prefix="agentfleet_bench") as url:
        engine = make_engine(url)
        with engine.begin() as conn:
            changed = "now() - interval '2 days' + g * interval '100 ms'"
            conn.execute(text(f"INSERT INTO runs ({COLUMNS}) SELECT 'r' || g, 'a', 'g' || g, 't', 'SUCCEEDED', 1, 3, "
                              f"'{{}}', '{{}}', 0, 0, 0, 0, {changed}, {changed}, 0 "
                              f"FROM generate_series(1, {ENDED}) g"))
            # Each ended run answered a reply_to, delivered (what `agentfleet submit` and AMQP clients leave).
            conn.execute(text("INSERT INTO run_replies (run_id, reply_to, correlation_id, delivered_at) "
                              f"SELECT 'r' || g, 'amq.rabbitmq.reply-to', '', {changed} "
                              f"FROM generate_series(1, {ENDED}) g"))
            quiet = "now() - interval '1 hour'"
            conn.execute(text(f"INSERT INTO runs ({COLUMNS}) SELECT 'live' || g, 'a', 'lg' || g, 't', 'EXECUTING', "
                              f"1, 1, '{{}}', '{{}}', 0, 0, 0, 0, {quiet}, {quiet}, 0 "
                              f"FROM generate_series(1, {LIVE_RUNS}) g"))
            conn.execute(text("ANALYZE runs"))
            conn.execute(text("ANALYZE run_replies"))
        store, before = Store(engine), now() - timedelta(seconds=120)
        owed = select(T.run_replies.c.run_id).where(T.run_replies.c.delivered_at.is_(None))
        single = (select(T.runs).where(T.runs.c.updated_at < before, T.runs.c.redriven_at.is_(None),
                                       LIVE | T.runs.c.run_id.in_(owed))
                  .order_by(T.runs.c.updated_at, T.runs.c.run_id).limit(PAGE))
        ours, theirs = [], []
        for _ in range(3):
            started = time.perf_counter()
            page = store.quiet_runs(before, PAGE)
            ours.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            with engine.connect() as conn:
                old = [RunRecord.from_row(r) for r in conn.execute(single).all()]
            theirs.append((time.perf_counter() - started) * 1000)
            assert [r.run_id for r in page] == [r.run_id for r in old]
        engine.dispose()
    print(f"{ENDED:,} ended runs, {LIVE_RUNS} live: a page of {PAGE} quiet runs in "
          f"{statistics.median(ours):.1f} ms (median of 3; the single query over every run: "
          f"{statistics.median(theirs):.1f} ms)")


if __name__ == "__main__":
    main()
