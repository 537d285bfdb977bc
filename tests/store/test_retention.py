"""Retention on both databases: which ended runs go, with every row that hangs off them, and what stays."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from agentfleet.loop.states import RunState
from agentfleet.loop.transcript import Message
from agentfleet.roles.retention import Cutoff, cutoffs, prune
from agentfleet.store import Store
from agentfleet.store import tables as T
from agentfleet.store.records import now

pytestmark = pytest.mark.integration

DAY = timedelta(days=1)


def make_run(store: Store, *, agent: str = "a", state: RunState = RunState.SUCCEEDED, age: timedelta = 10 * DAY,
             parent: str | None = None, artifacts: dict[str, bytes] | None = None) -> str:
    """A run of ``agent`` last changed ``age`` ago, with a step, messages, an audit row, an observation, a dedupe
    mark, a delivered reply, an approval, a domain event, and links to ``artifacts``."""
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    at = now() - age
    with store.tx() as conn:
        store.create_run(conn, run_id=run_id, agent=agent, goal_id=run_id, trace_id="t", input={}, limits={})
        conn.execute(update(T.runs).where(T.runs.c.run_id == run_id).values(
            state=state.value, updated_at=at, created_at=at, parent_run_id=parent))
        store.append_messages(conn, run_id, 0, [Message(role="user", content="hi"), Message(role="assistant",
                                                                                            content="hello")])
        conn.execute(T.audit.insert().values(at=at, run_id=run_id, agent=agent, from_state="PENDING",
                                             to_state=state.value, iteration=0, input_tokens=0, output_tokens=0,
                                             cost_usd=0.0, worker="w"))
        conn.execute(T.observations.insert().values(run_id=run_id, iteration=0, call_id="c", tool="t", result={},
                                                    received_at=at))
        store.mark_processed(conn, f"e-{run_id}", "planner", [], run_id)
        store.add_reply(conn, run_id, "amq.rabbitmq.reply-to", "x")
        conn.execute(update(T.run_replies).where(T.run_replies.c.run_id == run_id).values(delivered_at=at))
        conn.execute(T.approvals.insert().values(
            approval_id=f"ap-{run_id}", run_id=run_id, iteration=0, call_id="c", agent=agent, tool="t", arguments={},
            shown={}, args_schema={}, request={}, rule="r", reason="why", status="approved", requested_at=at))
        store.record_domain_event(conn, event_id=f"d-{run_id}", name="thing.done", payload={}, source="run",
                                  run_id=run_id, step_key="k", trace_id="t")
        if artifacts:
            store.keep_artifacts(conn, run_id=run_id, call_id="c", tool="t",
                                 refs=[{"ref": ref, "size": len(b)} for ref, b in artifacts.items()],
                                 payloads=dict(artifacts))
    store.begin_step(key=f"k-{run_id}", run_id=run_id, iteration=0, kind="plan", call_id="")
    return run_id


def rows_of(store: Store, run_id: str) -> dict[str, int]:
    with store.reading() as conn:
        return {t.name: int(conn.execute(select(func.count()).select_from(t).where(t.c.run_id == run_id)).scalar())
                for t in (T.runs, T.steps, T.messages, T.observations, T.processed_events, T.run_replies, T.audit,
                          T.approvals, T.domain_events, T.run_artifacts)}


def artifact_refs(store: Store) -> set[str]:
    with store.reading() as conn:
        return set(conn.execute(select(T.artifacts.c.ref)).scalars())


def everything(store: Store) -> list[Cutoff]:
    return cutoffs(5, {}, now())


def test_an_old_ended_run_goes_whole_and_a_recent_or_live_one_stays(store: Store) -> None:
    old = make_run(store, artifacts={f"sha256:{uuid.uuid4().hex}": b"kept output"})
    assert all(rows_of(store, old).values())  # every table holds something of it
    recent = make_run(store, age=timedelta(days=1))
    live = make_run(store, state=RunState.PLANNING)
    waiting = make_run(store, state=RunState.WAITING_APPROVAL)
    report = prune(store, everything(store), pause_s=0)
    assert not any(rows_of(store, old).values())
    for kept in (recent, live, waiting):
        assert all(n for t, n in rows_of(store, kept).items() if t != "run_artifacts"), kept
    assert report.runs >= 1 and report.rows["steps"] >= 1 and report.rows["messages"] >= 2
    assert (report.freed_bytes or 0) > 0 if store.dialect == "postgresql" else report.freed_bytes is None


def test_what_is_owed_or_still_in_a_live_tree_stays(store: Store) -> None:
    owes = make_run(store)
    with store.tx() as conn:
        store.add_reply(conn, owes, "reply-queue", "c2")  # a Result not yet delivered
    live_parent = make_run(store, state=RunState.WAITING_CHILDREN)
    child_of_live = make_run(store, parent=live_parent)
    parent_of_live = make_run(store)
    make_run(store, state=RunState.EXECUTING, parent=parent_of_live)
    prune(store, everything(store), pause_s=0)
    for kept in (owes, child_of_live, parent_of_live):
        assert rows_of(store, kept)["runs"] == 1, kept


def test_an_agents_own_keeping_time_holds_over_the_default(store: Store) -> None:
    kept_agent = f"keeper{uuid.uuid4().hex[:6]}"
    mine = make_run(store, agent=kept_agent, age=10 * DAY)
    older = make_run(store, agent=kept_agent, age=40 * DAY)
    other = make_run(store, age=10 * DAY)
    policy = cutoffs(5, {kept_agent: 30, "unset": None}, now())
    assert [c.agents for c in policy] == [(kept_agent,), None] and policy[1].other_than == (kept_agent,)
    prune(store, policy, pause_s=0)
    assert rows_of(store, mine)["runs"] == 1
    assert rows_of(store, older)["runs"] == 0 and rows_of(store, other)["runs"] == 0
    assert cutoffs(None, {kept_agent: 30}, now())[0].agents == (kept_agent,)  # no default: only its runs go
    assert cutoffs(None, {}, now()) == []


def test_artifacts_go_when_no_run_links_them_and_stay_while_one_does(store: Store) -> None:
    shared, alone = f"sha256:{uuid.uuid4().hex}", f"sha256:{uuid.uuid4().hex}"
    make_run(store, artifacts={shared: b"both", alone: b"only the old run"})
    keeper = make_run(store, age=timedelta(hours=1), artifacts={shared: b"both"})
    with store.tx() as conn:  # produced long ago: only the age of unlinked content decides
        conn.execute(update(T.artifacts).where(T.artifacts.c.ref.in_([shared, alone]))
                     .values(created_at=now() - 20 * DAY))
    prune(store, everything(store), pause_s=0)
    refs = artifact_refs(store)
    assert shared in refs and alone not in refs
    assert store.artifact_of_run(keeper, shared) == b"both"


def test_content_produced_again_is_never_deleted_under_its_new_link(store: Store) -> None:
    """The race retention has with a call storing content it already holds: the call touches the row first, so
    the deletion (which re-reads the row's age) leaves it; content deleted first is stored anew by the call."""
    ref = f"sha256:{uuid.uuid4().hex}"
    make_run(store, artifacts={ref: b"again"})
    with store.tx() as conn:
        conn.execute(update(T.artifacts).where(T.artifacts.c.ref == ref).values(created_at=now() - 20 * DAY))
        conn.execute(T.run_artifacts.delete().where(T.run_artifacts.c.ref == ref))  # its run was pruned
    before = now() - 5 * DAY
    assert ref in store.orphan_artifacts(before, 10_000)
    fresh = make_run(store, age=timedelta(0), artifacts={ref: b"again"})  # produced again, after the scan
    assert store.delete_artifacts([ref], before) == {"artifacts": 0, "artifact_chunks": 0}
    assert store.artifact_of_run(fresh, ref) == b"again"
    gone = f"sha256:{uuid.uuid4().hex}"
    make_run(store, artifacts={gone: b"twice"})
    with store.tx() as conn:
        conn.execute(T.run_artifacts.delete().where(T.run_artifacts.c.ref == gone))
        conn.execute(update(T.artifacts).where(T.artifacts.c.ref == gone).values(created_at=now() - 20 * DAY))
    assert store.delete_artifacts([gone], before)["artifacts"] == 1
    again = make_run(store, age=timedelta(0), artifacts={gone: b"twice"})
    assert store.artifact_of_run(again, gone) == b"twice"


def test_a_dry_run_counts_what_a_real_one_deletes_and_deletes_nothing(store: Store) -> None:
    policy = [Cutoff(now() - 5 * DAY, agents=(f"dry{uuid.uuid4().hex[:6]}",))]
    ids = [make_run(store, agent=policy[0].agents[0]) for _ in range(5)]  # type: ignore[index]
    dry = prune(store, policy, dry_run=True, pause_s=0)
    assert dry.runs == 5 and all(rows_of(store, r)["runs"] == 1 for r in ids)
    real = prune(store, policy, batch=2, pause_s=0)  # three batches
    assert real.runs == 5 and {k: v for k, v in real.rows.items() if k in dry.rows and k != "artifacts"} == {
        k: v for k, v in dry.rows.items() if k != "artifacts"}
    assert not any(rows_of(store, r)["runs"] for r in ids)


def test_history_that_belongs_to_no_run_goes_past_the_default_keeping_time(store: Store) -> None:
    old_at, new_at = now() - 10 * DAY, now()
    tag = uuid.uuid4().hex[:8]
    with store.tx() as conn:
        for at, name in ((old_at, "old"), (new_at, "new")):
            store.record_health_change(conn, event_id=f"h-{name}-{tag}", tool="t", kind="check", status="down",
                                       detail=None, by="w", occurred_at=at)
            store.record_domain_event(conn, event_id=f"x-{name}-{tag}", name="outside.thing", payload={},
                                      source="external", run_id=None, step_key=None, trace_id="t")
            store.mark_processed(conn, f"m-{name}-{tag}", "observer", [])
        conn.execute(update(T.domain_events).where(T.domain_events.c.event_id == f"x-old-{tag}")
                     .values(recorded_at=old_at))
        conn.execute(update(T.processed_events).where(T.processed_events.c.event_id == f"m-old-{tag}")
                     .values(processed_at=old_at))
    counted = store.count_history(now() - 5 * DAY)
    assert all(counted[t] >= 1 for t in ("tool_health_events", "domain_events", "processed_events")), counted
    prune(store, [], history_before=now() - 5 * DAY, pause_s=0)

    def there(table: Any, column: Any, key: str) -> bool:
        with store.reading() as conn:
            return conn.execute(select(func.count()).select_from(table).where(column == key)).scalar() == 1

    assert not there(T.tool_health_events, T.tool_health_events.c.event_id, f"h-old-{tag}")
    assert there(T.tool_health_events, T.tool_health_events.c.event_id, f"h-new-{tag}")
    assert not there(T.domain_events, T.domain_events.c.event_id, f"x-old-{tag}")
    assert there(T.domain_events, T.domain_events.c.event_id, f"x-new-{tag}")
    assert not there(T.processed_events, T.processed_events.c.event_id, f"m-old-{tag}")
    assert there(T.processed_events, T.processed_events.c.event_id, f"m-new-{tag}")


def test_a_thread_is_forgotten_once_its_last_run_is_gone(store: Store) -> None:
    thread = f"th-{uuid.uuid4().hex[:8]}"
    run = make_run(store)
    with store.tx() as conn:
        store.hold_thread(conn, thread, place=True)
        conn.execute(update(T.runs).where(T.runs.c.run_id == run).values(thread_id=thread, thread_seq=1))
        conn.execute(update(T.threads).where(T.threads.c.thread_id == thread).values(updated_at=now() - 10 * DAY))
    prune(store, everything(store), history_before=now() - 5 * DAY, pause_s=0)
    assert rows_of(store, run)["runs"] == 0 and not store.thread_runs(thread)
    assert not [t for t in store.threads_page(1000) if t["thread_id"] == thread]


def test_the_database_reports_its_size(store: Store) -> None:
    size = store.database_bytes()
    assert isinstance(size, int) and size > 0


def test_the_observers_pass_runs_one_at_a_time_fleet_wide_and_only_with_a_keeping_time(store: Store) -> None:
    from agentfleet.roles.retention import RETENTION_LOCK, apply_policy

    old = make_run(store)
    assert apply_policy(store, None, []) is None  # nothing to apply: kept for ever
    with store.step_lock(RETENTION_LOCK, own_connection=True) as held:
        assert held and apply_policy(store, 5, []) is None  # another observer's pass is running
    assert rows_of(store, old)["runs"] == 1
    report = apply_policy(store, 5, [])
    assert report is not None and report.runs >= 1 and rows_of(store, old)["runs"] == 0
