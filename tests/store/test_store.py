"""The repository on both databases it runs on: SQLite (embedded) and Postgres (distributed)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from agentfleet.loop.states import RunState
from agentfleet.store import Store, make_engine

pytestmark = pytest.mark.integration


def new_run(store: Store, run_id: str) -> None:
    with store.tx() as conn:
        assert store.create_run(conn, run_id=run_id, agent="a", goal_id=run_id, trace_id="t", input={}, limits={})


def test_creating_the_same_run_twice_creates_it_once(store: Store) -> None:
    new_run(store, "r-once")
    with store.tx() as conn:
        assert not store.create_run(conn, run_id="r-once", agent="a", goal_id="r-once", trace_id="t", input={},
                                    limits={})


def test_a_transition_is_a_compare_and_set(store: Store) -> None:
    new_run(store, "r-cas")
    run = store.get_run("r-cas")
    assert run is not None
    with store.tx() as conn:
        assert store.transition(conn, run, RunState.PLANNING)
    with store.tx() as conn:  # the same (state, version) again is stale
        assert not store.transition(conn, run, RunState.PLANNING)
    current = store.get_run("r-cas")
    assert current is not None and current.state == RunState.PLANNING and current.version == 1


def test_an_illegal_transition_is_a_no_op(store: Store) -> None:
    new_run(store, "r-illegal")
    run = store.get_run("r-illegal")
    assert run is not None
    with store.tx() as conn:
        assert not store.transition(conn, run, RunState.SUCCEEDED)
    assert store.get_run("r-illegal").state == RunState.PENDING  # type: ignore[union-attr]


def test_an_unfinished_intent_counts_attempts_and_a_finished_one_is_final(store: Store) -> None:
    first = store.begin_step(key="k-steps", run_id="r", iteration=0, kind="tool", call_id="c")
    assert first.fresh and first.attempts == 1 and first.status == "started"
    again = store.begin_step(key="k-steps", run_id="r", iteration=0, kind="tool", call_id="c")
    assert not again.fresh and again.attempts == 2
    with store.tx() as conn:
        store.finish_step(conn, "k-steps", status="succeeded", output={"ok": True}, duration_ms=1.0)
    done = store.begin_step(key="k-steps", run_id="r", iteration=0, kind="tool", call_id="c")
    assert done.status == "succeeded" and done.attempts == 2 and done.output == {"ok": True}


def test_an_event_is_marked_processed_once_with_its_outbox(store: Store) -> None:
    assert store.processed_outbox("e-1", "planner") is None
    with store.tx() as conn:
        assert store.mark_processed(conn, "e-1", "planner", [{"x": 1}])
    with store.tx() as conn:
        assert not store.mark_processed(conn, "e-1", "planner", [{"x": 2}])
    assert store.processed_outbox("e-1", "planner") == [{"x": 1}]
    assert store.processed_outbox("e-1", "observer") is None


def test_an_outbox_encoded_in_one_pass_reads_back_as_its_events_did_and_text_utf8_cannot_carry_still_does(
        store: Store) -> None:
    """A handling's outbox is written by pydantic's serializer in one pass (``outbox_json``), not as ``wire`` dicts
    through the json module: what is read back, and redelivered from, must be the same events either way, text
    outside ASCII included; a lone surrogate, which UTF-8 cannot carry, takes the json module's way still."""
    from agentfleet.events.contracts import Result, ResultStatus
    from agentfleet.events.envelope import Envelope, EventType, RunEnded, decode, outbox_json

    def ended(message: str) -> Envelope:
        result = Result(status=ResultStatus.FAILED, run_id="r", goal_id="g", agent="a", message=message)
        return Envelope.new(EventType.RUN_FAILED, "r", RunEnded(result=result.model_dump(mode="json")), trace_id="t")

    events = [ended("naïve 名前 \u2028 \"quoted\""), ended("second")]
    encoded = outbox_json(events)
    assert isinstance(encoded, str)
    with store.tx() as conn:
        assert store.mark_processed(conn, "e-json", "planner", encoded)
    stored = store.processed_outbox("e-json", "planner")
    assert stored == [e.wire() for e in events]
    assert [decode(e) for e in stored or []] == events
    lone = [ended("half a pair: \ud800")]
    assert outbox_json(lone) is None  # the handling stores ``wire`` dicts, as before
    assert outbox_json([]) == "[]"


def test_reply_targets_are_kept_once_and_marked_delivered(store: Store) -> None:
    with store.tx() as conn:
        store.add_reply(conn, "r-reply", "q1", "c1")
        store.add_reply(conn, "r-reply", "q1", "c1")
        store.add_reply(conn, "r-reply", "q2", None)
    pending = store.pending_replies("r-reply")
    assert [(q, c) for _, q, c in pending] == [("q1", "c1"), ("q2", "")]
    with store.tx() as conn:
        store.mark_replied(conn, [pending[0][0]])
    assert [(q, c) for _, q, c in store.pending_replies("r-reply")] == [("q2", "")]


def test_a_step_lock_is_exclusive_until_released(store: Store) -> None:
    results: list[bool] = []
    with store.step_lock("lock-1") as held:
        assert held
        t = threading.Thread(target=lambda: results.append(store.step_lock("lock-1").__enter__()))
        t.start()
        t.join()
    assert results == [False]
    with store.step_lock("lock-1") as held:
        assert held


def test_a_step_lock_dies_with_the_process_that_held_it(pg_url: str) -> None:
    store = Store(make_engine(pg_url))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; from agentfleet.store import Store, make_engine; s=Store(make_engine(sys.argv[1]));"
         "cm=s.step_lock('lock-proc'); assert cm.__enter__(); print('held', flush=True); time.sleep(60)", pg_url],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with store.step_lock("lock-proc") as held:
            assert not held
        holder.kill()  # SIGKILL: no cleanup code runs; Postgres drops the session and its lock
        holder.wait()
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with store.step_lock("lock-proc") as held:
                if held:
                    break
            time.sleep(0.1)
        assert held
    finally:
        holder.kill()
        store.engine.dispose()


def test_quiet_runs_are_read_a_page_at_a_time_in_age_order(store: Store) -> None:
    """The sweeper pages through quiet runs: one still waiting on the first page cannot hide one on the next."""
    import uuid
    from datetime import timedelta

    from agentfleet.store.records import now

    prefix = f"quiet-{uuid.uuid4().hex[:6]}"
    for i in range(5):
        new_run(store, f"{prefix}-{i}")
    later = now() + timedelta(seconds=1)
    seen: list[str] = []
    after = None
    while page := store.quiet_runs(later, 2, after):
        seen += [r.run_id for r in page]
        after = (page[-1].updated_at, page[-1].run_id)
    ours = [r for r in seen if r.startswith(prefix)]
    assert sorted(ours) == [f"{prefix}-{i}" for i in range(5)] and len(seen) == len(set(seen))
    with store.tx() as conn:
        store.note_redrive(conn, f"{prefix}-0")
    redriven = store.get_run(f"{prefix}-0")
    assert redriven is not None and redriven.redrives == 1 and redriven.redriven_at is not None
    quiet = [r.run_id for r in store.quiet_runs(redriven.redriven_at, 1000)]  # a stall counted from then on
    assert f"{prefix}-0" not in quiet and f"{prefix}-1" in quiet


def test_the_transcript_is_read_once_per_iteration_and_never_again_once_complete(store: Store) -> None:
    """Issue "Durability nearly free", item 5: planning reads only what is new. Iterations before the last one a
    read saw are complete (their tool results are written with the next turn) and kept; rows of those iterations
    deleted behind the store's back still come back, so they were not read again, while a store with nothing kept
    reads exactly what the table holds."""
    from agentfleet.loop.transcript import Message
    from agentfleet.store import tables as T

    new_run(store, "r-transcript")
    turn = [Message(role="assistant", content=f"turn {i}") for i in range(4)]
    results = [Message(role="tool", tool_call_id=f"c{i}", content=f"result {i}") for i in range(4)]
    with store.tx() as conn:
        store.append_messages(conn, "r-transcript", 0, [turn[0]])
    assert store.transcript("r-transcript") == [turn[0]]
    for i in range(1, 4):  # each plan step: the last iteration's results, then this iteration's turn
        with store.tx() as conn:
            store.append_messages(conn, "r-transcript", i - 1, [results[i - 1]], start=1)
            store.append_messages(conn, "r-transcript", i, [turn[i]])
        expected = [m for j in range(i) for m in (turn[j], results[j])] + [turn[i]]
        assert store.transcript("r-transcript") == expected
    with store.tx() as conn:  # iterations 0-2 are complete and kept (only 3 is read again): delete two of them
        conn.execute(T.messages.delete().where(T.messages.c.run_id == "r-transcript", T.messages.c.iteration <= 1))
    assert store.transcript("r-transcript") == expected
    fresh = Store(store.engine)
    assert fresh.transcript("r-transcript") == [turn[2], results[2], turn[3]]


def test_a_transcript_a_plan_committed_is_known_through_its_turn_at_the_version_it_left(store: Store) -> None:
    """What the planner's commit of an iteration leaves is known without a read (``keep_planned``): every message
    before its turn, then the turn, for the run at the version that commit left it (or the observer's move after it);
    at any other iteration or version, or once a read has moved the kept iterations on, nothing is claimed."""
    from agentfleet.loop.transcript import History, Message

    turn = [Message(role="assistant", content=f"turn {i}") for i in range(3)]
    results = [Message(role="tool", tool_call_id=f"c{i}", content=f"result {i}") for i in range(3)]
    before = History().plus([turn[0], results[0]])
    store.keep_planned("r-planned", 1, before, turn[1], 7)
    known = store.planned_history("r-planned", 1, (8, 7))
    assert known is not None and known.messages == [turn[0], results[0], turn[1]]
    assert known.chars == History().plus(known.messages).chars
    assert store.planned_history("r-planned", 1, (9, 8)) is None  # moved on since, by someone else
    assert store.planned_history("r-planned", 2, (8, 7)) is None  # another iteration's plan
    assert store.planned_history("r-other", 1, (8, 7)) is None
    new_run(store, "r-planned-read")
    with store.tx() as conn:
        store.append_messages(conn, "r-planned-read", 0, [turn[0], results[0]])
        store.append_messages(conn, "r-planned-read", 1, [turn[1], results[1]])
        store.append_messages(conn, "r-planned-read", 2, [turn[2]])
    store.keep_planned("r-planned-read", 1, before, turn[1], 3)
    assert store.planned_history("r-planned-read", 1, (3,)) is not None
    store.history("r-planned-read")  # a read that saw iteration 2: what is kept is no longer the plan of 1's
    assert store.planned_history("r-planned-read", 1, (3,)) is None


def test_a_planned_turn_heavier_than_what_transcripts_may_keep_is_not_kept(store: Store,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn kept with a plan weighs with the run's messages: a run whose turn alone is past the cap is read."""
    from agentfleet.loop.transcript import History, Message
    from agentfleet.store import transcript as kept

    monkeypatch.setattr(kept, "TRANSCRIPT_BYTES_KEPT", 2_000)
    before = History().plus([Message(role="assistant", content="t0"), Message(role="tool", tool_call_id="c0",
                                                                               content="r0")])
    store.keep_planned("r-heavy-turn", 1, before, Message(role="assistant", content="x" * 5_000), 4)
    assert store.planned_history("r-heavy-turn", 1, (4,)) is None
    assert store.transcripts_weight() <= 2_000
    store.keep_planned("r-light-turn", 1, before, Message(role="assistant", content="t1"), 4)
    assert store.planned_history("r-light-turn", 1, (4,)) is not None


def test_the_sweepers_scan_reads_only_live_runs_and_owed_results_through_their_indexes(store: Store) -> None:
    """Issue "Durability nearly free", item 5: the sweeper's scan does not grow with ended runs, nor with the
    Results delivered for them. On Postgres (sequential scans refused for the question) its query must be
    answerable from the partial indexes of live runs and of undelivered replies; a predicate that drifted from an
    index's, or a missing index, leaves only a scan of every row."""
    if store.dialect != "postgresql":
        pytest.skip("the plan is Postgres's; SQLite has the same indexes and query")
    from sqlalchemy import text

    from agentfleet.store.records import now

    with store.engine.connect() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        sql = store.quiet_runs_query(now(), 50).compile(conn, compile_kwargs={"literal_binds": True})
        plan = "\n".join(conn.execute(text(f"EXPLAIN {sql}")).scalars())
        conn.rollback()
    assert "ix_runs_live" in plan and "ix_run_replies_owed" in plan, plan


def test_quiet_runs_hold_live_runs_and_ended_ones_owing_a_result_merged_in_age_order(store: Store) -> None:
    """The sweeper's page is two pages merged (live runs through their index, ended runs owing a Result): an
    ended run whose Result was delivered, or never asked for, is not in it; one still owed is, in its place."""
    import uuid
    from datetime import timedelta

    from agentfleet.store.records import now

    prefix = f"merged-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{i}" for i in range(4)]  # created in this order: oldest first
    for name in names:
        new_run(store, name)
    for name, owes in ((names[1], True), (names[2], False)):
        with store.tx() as conn:
            run = store.get_run(name, conn, lock=True)
            assert run is not None
            moved = store.transition(conn, run, RunState.PLANNING)
            assert moved is not None and store.transition(conn, moved, RunState.SUCCEEDED)
            if owes:
                store.add_reply(conn, name, "reply-queue", None)
    later = now() + timedelta(seconds=1)
    quiet = [r.run_id for r in store.quiet_runs(later, 1000) if r.run_id.startswith(prefix)]
    assert quiet == [names[0], names[3], names[1]]  # by last change: the two ended ones moved last, in that order


def test_what_the_transcript_reads_keep_is_bounded_in_bytes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few long runs of large turns must not grow a planner without bound: past the cap in bytes (the messages' JSON,
    what a prompt sends), the least recently planned run's kept iterations are dropped (its next read reads the table
    again), the others kept; a run whose complete iterations alone weigh more than the cap is never kept."""
    from agentfleet.loop.transcript import History, Message
    from agentfleet.store import tables as T
    from agentfleet.store import transcript as kept

    def turn(i: int, big: bool) -> Message:
        return Message(role="assistant", content=f"t{i}" + ("x" * 4000 if big else ""))

    def result(i: int) -> Message:
        return Message(role="tool", tool_call_id=f"c{i}", content="r")

    one_run = History.of([turn(0, False), result(1), turn(1, False), result(2)]).chars
    monkeypatch.setattr(kept, "TRANSCRIPT_BYTES_KEPT", one_run + one_run // 2)  # one run's complete iterations fit
    runs = {"r-cap-old": False, "r-cap-new": False, "r-cap-huge": True}
    for run, big in runs.items():
        new_run(store, run)
        for i in range(3):  # iterations 0 and 1 complete (4 messages), 2 still open
            with store.tx() as conn:
                if i:
                    store.append_messages(conn, run, i - 1, [result(i)], start=1)
                store.append_messages(conn, run, i, [turn(i, big)])
        if run != "r-cap-huge":
            assert len(store.transcript(run)) == 5
    assert len(store.transcript("r-cap-huge")) == 5  # read last: too heavy to keep, so the others stay kept
    assert store.transcripts_weight() <= kept.TRANSCRIPT_BYTES_KEPT
    with store.tx() as conn:  # behind the store's back: what comes back was kept, what is missing was read
        conn.execute(T.messages.delete().where(T.messages.c.run_id.in_(list(runs)), T.messages.c.iteration == 0))
    assert len(store.transcript("r-cap-new")) == 5  # kept: one run's weight, within the cap
    assert len(store.transcript("r-cap-old")) == 3  # dropped when the second run's weight made it too much: read again
    assert len(store.transcript("r-cap-huge")) == 3  # never kept
