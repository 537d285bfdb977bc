"""Threads: a conversation that continues across goals, one run at a time, stored once.

Embedded for what a user sees (a fact told in the first goal answers the third); the real fleet for the order
under concurrent planners (20 goals at once on one thread run one at a time, in order)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agentfleet import constants as C
from agentfleet.loop.keys import run_id_for
from agentfleet.store import Store
from agentfleet.store import tables as T
from tests.conftest import ROOT, WorkerProcs
from tests.helpers import AmqpClient, embedded_fleet, wait_for_run


def test_a_thread_remembers_what_an_earlier_goal_said(tmp_path: Path) -> None:
    with embedded_fleet(tmp_path, "tests.fixtures.agents") as fleet:
        said = []
        for goal in ({"remember": "my favourite colour is teal"}, {"chat": "hello"}, {"ask": "my colour?"}):
            run = wait_for_run(fleet.store, fleet.submit({"agent": "chatty", "input": goal, "thread_id": "t1"}))
            said.append(run.result["output"]["seen"][0] if run.result else None)
        alone = wait_for_run(fleet.store, fleet.submit({"agent": "chatty", "input": {"ask": "my colour?"}}))
        other = wait_for_run(fleet.store, fleet.submit({"agent": "chatty", "input": {"ask": "my colour?"},
                                                        "thread_id": "t2"}))
        stranger = wait_for_run(fleet.store, fleet.submit({"agent": "chatty_other", "input": {"ask": "colour?"},
                                                           "thread_id": "t1"}))
        runs = [r for r in fleet.store.thread_runs("t1") if r.agent == "chatty"]
    assert said == ["noted", "teal", "teal"]  # every later goal of the thread is shown the first
    assert alone.result and alone.result["output"]["seen"] == ["unknown"]  # no thread: nothing carried over
    assert other.result and other.result["output"]["seen"] == ["unknown"]  # another thread: its own
    # Another agent naming the thread is shown none of it: what one agent's runs answered is not another's to read.
    assert stranger.result and stranger.result["output"]["seen"] == ["unknown"]
    assert next(r.input for r in runs) == {"remember": "my favourite colour is teal"} and len(runs) == 3

    listed = subprocess.run([sys.executable, "-m", "agentfleet.cli", "thread", "t1", "--embedded", "--json"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120,
                            env={"PYTHONPATH": str(ROOT), "AGENTFLEET_AGENTS": "tests.fixtures.agents",
                                 "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/fleet.db",
                                 "AGENTFLEET_WORKSPACE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert listed.returncode == 0, listed.stderr
    shown = json.loads(listed.stdout)
    assert [r["state"] for r in shown] == ["SUCCEEDED"] * 4 and "teal" in shown[2]["answer"]


@pytest.mark.integration
def test_twenty_goals_at_once_on_one_thread_run_one_at_a_time_in_order(workers: WorkerProcs, namespace: str,
                                                                       store: Store, tmp_path: Path) -> None:
    for role in C.ROLES:
        workers.start(role)
    workers.wait_ready()
    client = AmqpClient()
    thread = f"t-{uuid.uuid4().hex[:8]}"
    corrs = [client.publish_goal(namespace, "goal.turn_taker", {"agent": "turn_taker", "input": {"n": i},
                                                                 "goal_id": f"{thread}-{i}", "thread_id": thread})
             for i in range(20)]
    replies = client.replies(20, timeout=120)
    client.close()
    assert all(replies[c]["status"] == "succeeded" for c in corrs), [replies[c] for c in corrs]
    runs = store.thread_runs(thread)
    assert len(runs) == 20
    turns = sorted((float(start), float(end), int(n)) for n, start, end in
                   (line.split() for line in (tmp_path / "turns.txt").read_text().splitlines()))
    for (_, end, _), (start, _, _) in itertools.pairwise(turns):
        assert start >= end, "two runs of one thread ran at once"
    by_creation = [int(r.input["n"]) for r in runs]
    assert [n for _, _, n in turns] == by_creation  # each ran in the order its run was made
    seen = {int(r.input["n"]): r.result["output"]["seen"][0] for r in runs if r.result}
    assert [seen[n] for n in by_creation] == list(range(20))  # each saw every earlier goal of its thread
    with store.reading() as conn:  # stored once: each run keeps its own messages, none of the thread's before it
        per_run = [conn.execute(select(func.count()).select_from(T.messages)
                                .where(T.messages.c.run_id == r.run_id)).scalar() for r in runs]
    assert len(set(per_run)) == 1, per_run
    assert runs[0].started_at is not None and all(r.began_at >= runs[0].began_at for r in runs)
    assert run_id_for("turn_taker", f"{thread}-0") in {r.run_id for r in runs}
