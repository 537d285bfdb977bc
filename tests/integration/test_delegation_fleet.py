"""Delegation on the real fleet: children run on any worker, answer their parent's calls, and end with it."""

from __future__ import annotations

from agentfleet.config.settings import get_settings
from agentfleet.loop.states import RunState
from agentfleet.store import Store
from agentfleet.workers.client import FleetClient
from tests.conftest import WorkerProcs
from tests.helpers import AmqpClient, eventually
from tests.integration.test_health_gate import start_fleet, submit


def descendants(store: Store, run_id: str) -> list:
    out = []
    for child in store.children(run_id):
        out += [child, *descendants(store, child.run_id)]
    return out


def test_delegations_and_a_plain_call_fan_in_on_the_fleet(workers: WorkerProcs, namespace: str, store: Store) -> None:
    start_fleet(workers)
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "asker", {"queries": ["alpha", "boom"]})
    result = client.replies(1, timeout=90)[corr]
    assert result["status"] == "succeeded", result
    oks = sorted(s["ok"] for s in result["output"]["seen"])
    assert oks == [False, True, True]  # the failed child is a structured error the parent's model saw
    children = store.children(run_id)
    assert sorted((c.agent, c.state) for c in children) == [("lookup", RunState.FAILED),
                                                            ("lookup", RunState.SUCCEEDED)]
    root = store.get_run(run_id)
    assert root is not None and root.steps_used == 2 + sum(c.steps_used for c in children)


def test_cancelling_the_root_on_the_fleet_cancels_every_descendant(workers: WorkerProcs, namespace: str,
                                                                   store: Store) -> None:
    start_fleet(workers)
    client = AmqpClient()
    corr, run_id = submit(client, namespace, "cancel_root")
    eventually(lambda: any(r.agent == "counter" for r in descendants(store, run_id)), timeout=60,
               message="the grandchild never started")
    with FleetClient(get_settings()) as fleet:
        fleet.cancel(run_id, "no longer needed")
    assert client.replies(1, timeout=30)[corr]["status"] == "cancelled"
    eventually(lambda: all(r.state == RunState.CANCELLED for r in descendants(store, run_id)), timeout=30,
               message="a descendant outlived its cancelled root")
    assert sorted(r.agent for r in descendants(store, run_id)) == ["cancel_middle", "counter"]
