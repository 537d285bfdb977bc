"""Pages of runs read an index in order on Postgres, whatever the filter and however deep the page: the plan
has no sort of the table, so a page's cost does not grow with the number of runs (the console's rule)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, text

from agentfleet.store import Store
from agentfleet.store import tables as T
from agentfleet.store.records import now

pytestmark = pytest.mark.integration
RUNS = 3000


@pytest.fixture
def many_runs(store: Store) -> list[dict[str, Any]]:
    at = now()
    agents = ("alpha", "beta", "gamma")
    rows = [{"run_id": f"pages-{uuid.uuid4().hex}", "agent": agents[i % 3], "goal_id": f"g-{i}-{uuid.uuid4().hex}",
             "trace_id": uuid.uuid4().hex, "state": "FAILED" if i % 10 == 0 else "SUCCEEDED", "version": 0,
             "iteration": 0, "input": {}, "limits": {}, "created_at": at - timedelta(seconds=i),
             "updated_at": at - timedelta(seconds=i)} for i in range(RUNS)]
    with store.engine.begin() as conn:
        conn.execute(insert(T.runs), rows)
        conn.execute(text("ANALYZE runs"))
    yield rows
    with store.engine.begin() as conn:
        conn.execute(T.runs.delete().where(T.runs.c.run_id.like("pages-%")))


def plan(store: Store, **filters: Any) -> str:
    stmt = store.runs_query(limit=51, **filters)
    with store.engine.connect() as conn:
        compiled = stmt.compile(conn, compile_kwargs={"literal_binds": True})
        if store.dialect == "sqlite":
            return "\n".join(str(r[-1]) for r in conn.execute(text(f"EXPLAIN QUERY PLAN {compiled}")).all())
        # A test table is small: the planner would read it whole, or sort what a bitmap found. Penalized, a sort stays
        # in the plan only when no index gives the order (what a table of millions needs).
        # (A goal id's runs are found by their own index and sorted: that sort is not penalized.)
        for setting in ("enable_seqscan", "enable_bitmapscan", *(() if "goal_id" in filters else ("enable_sort",))):
            conn.execute(text(f"SET {setting} = off"))
        return "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN {compiled}")).all())


def test_every_page_of_runs_is_an_index_read_in_order(store: Store, many_runs: list[dict[str, Any]]) -> None:
    deep = (many_runs[2500]["created_at"], many_runs[2500]["run_id"])
    for filters in ({}, {"agent": "beta"}, {"states": ["FAILED"]}, {"since": now() - timedelta(hours=1)},
                    {"before": deep}, {"agent": "beta", "before": deep}, {"states": ["FAILED"], "before": deep},
                    {"goal_id": many_runs[77]["goal_id"]}):
        found = plan(store, **filters)
        if "goal_id" in filters:  # found by its own index; what is sorted is that goal's runs (one per agent at most)
            assert "ix_runs_goal" in found, found
            continue
        if store.dialect == "sqlite":
            assert "INDEX" in found and "TEMP B-TREE" not in found, (filters, found)
            continue
        assert "Index" in found and "Sort" not in found, (filters, found)
        assert "Filter: (ROW(" not in found, (filters, found)  # the cursor bounds the index, not a filter after it


def test_a_page_after_a_cursor_starts_right_after_it(store: Store, many_runs: list[dict[str, Any]]) -> None:
    deep = many_runs[2500]
    page = store.list_runs(before=(deep["created_at"], deep["run_id"]), limit=3)
    assert [r.run_id for r in page] == [r["run_id"] for r in many_runs[2501:2504]]


def test_what_the_model_said_is_read_per_iteration_and_a_row_that_is_no_message_is_skipped(store: Store) -> None:
    from agentfleet.loop.transcript import Message

    run_id = f"said-{uuid.uuid4().hex}"
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})
        store.append_messages(conn, run_id, 0, [Message(role="user", content="go"),
                                                Message(role="assistant", content="I will look first." + "x" * 900)])
        store.append_messages(conn, run_id, 1, [Message(role="assistant", content=None)])
    with store.engine.begin() as conn:
        conn.execute(insert(T.messages).values(run_id=run_id, iteration=2, position=0, body={"role": "martian"}))
    said = store.turn_texts(run_id, head=20)
    assert said == {0: "I will look first.xx"}


def test_a_live_views_mark_moves_when_a_run_of_it_moves_and_only_then(store: Store) -> None:
    from agentfleet.loop.states import RunState

    root, child = f"mark-{uuid.uuid4().hex}", f"mark-{uuid.uuid4().hex}"
    trace = uuid.uuid4().hex
    with store.tx() as conn:
        for run_id in (root, child):
            store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id=trace, input={}, limits={})
    before = store.trace_versions(root)
    assert before[0] == trace and {r for r, _ in before[1]} == {root, child}
    assert store.trace_versions(root) == before and (root, 0) in store.newest_versions(50)
    with store.tx() as conn:
        store.transition(conn, store.get_run(child, conn), RunState.PLANNING)  # type: ignore[arg-type]
    assert store.trace_versions(root) != before and store.trace_versions(child)[1] == store.trace_versions(root)[1]
    assert store.trace_versions("no-such-run") == (None, ())
