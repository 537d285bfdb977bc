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


def test_the_step_is_a_consumer_step_after_the_tasks_are_registered() -> None:
    app = create_app(Settings(namespace="heap-test"))
    assert FreezeStartupHeap in app.steps["consumer"]
    assert "celery.worker.consumer.tasks:Tasks" in FreezeStartupHeap.requires


def test_the_heap_is_frozen_once_a_process(thawed: None) -> None:
    step = FreezeStartupHeap(parent=None)
    step.start(None)
    frozen = gc.get_freeze_count()
    assert frozen > 0
    gc.unfreeze()
    step.start(None)  # a reconnect restarts the consumer's steps: no second collection and freeze
    assert gc.get_freeze_count() == 0
