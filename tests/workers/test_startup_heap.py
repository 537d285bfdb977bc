"""A worker's start-up heap is frozen once, just before it consumes: no full collection walks it again, the last
one at exit included (it was most of a worker's stop)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from agentfleet.config.settings import Settings
from agentfleet.workers.app import create_app
from agentfleet.workers.bootsteps import FreezeStartupHeap


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    FreezeStartupHeap._done = False
    yield
    gc.unfreeze()  # the test process's own heap goes back to the collector
    FreezeStartupHeap._done = False


def test_an_agentfleet_worker_freezes_its_heap_and_an_embedding_program_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a process of its own: an embedded fleet's app is built in someone else's program, whose later garbage
    cycles among what it had made by then would never be collected."""
    from celery import Celery
    from typer.testing import CliRunner

    from agentfleet.cli.app import app as cli
    from agentfleet.workers import preflight

    assert FreezeStartupHeap not in create_app(Settings(namespace="heap-test")).steps["consumer"]
    started: list[set[type]] = []
    monkeypatch.setattr(preflight, "preflight", lambda settings: None)  # no services: only the app is looked at
    monkeypatch.setattr(Celery, "worker_main", lambda self, argv: started.append(set(self.steps["consumer"])))
    done = CliRunner().invoke(cli, ["worker", "observer"])
    assert done.exit_code == 0, done.output
    assert [FreezeStartupHeap in steps for steps in started] == [True]


def test_the_heap_is_frozen_once_a_process(thawed: None) -> None:
    step = FreezeStartupHeap(parent=None)
    step.start(None)
    frozen = gc.get_freeze_count()
    assert frozen > 0
    gc.unfreeze()
    step.start(None)  # a reconnect restarts the consumer's steps: no second collection and freeze
    assert gc.get_freeze_count() == 0
