"""A shutdown signal wakes the worker's event loop at once, instead of when its next timer falls due.

Celery's handler for SIGTERM / SIGINT / SIGQUIT only sets a flag, which the consumer's loop reads between polls; the
poll itself is retried after the signal (PEP 475) until a timer or a message ends it: up to the timer's
``max_interval`` (2 s by default; 1.4-1.7 s seen on an idle worker). Here the only timer is 30 s away, the interval
is lifted and nothing arrives: without the waker the loop's step waits out kombu's 10 s cap and
returns woken by nothing; with it, the waker's pipe is what ends the wait.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType

import pytest
from celery import signals
from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Timer

from agentfleet.workers.bootsteps import WakeOnShutdown

LATER_S = 30.0


@pytest.fixture
def hub() -> Iterator[Hub]:
    hub = Hub(timer=Timer(max_interval=LATER_S))
    quiet, other = socket.socketpair()  # a connection that says nothing, as an idle broker's does
    hub.add_reader(quiet.fileno(), lambda: None)
    hub.call_later(LATER_S, lambda: None)
    yield hub
    hub.close()
    quiet.close()
    other.close()


def _celery_like_handler(signum: int, frame: FrameType | None) -> None:
    """What Celery's warm-shutdown handler does in the main process, besides setting its flag."""
    signals.worker_shutting_down.send(sender="test", sig="SIGUSR1", how="Warm", exitcode=0)


def test_a_shutdown_signal_ends_the_loops_wait_at_once(hub: Hub) -> None:
    step = WakeOnShutdown(parent=None)
    drained: list[bool] = []
    drain = step._drain
    step._drain = lambda: (drained.append(True), drain())  # type: ignore[method-assign]
    step.register_with_event_loop(None, hub)
    loop = hub.create_loop()
    previous = signal.signal(signal.SIGUSR1, _celery_like_handler)
    sender = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        sender.start()
        next(loop)  # waits in poll until something ends it: the waker's pipe, or kombu's 10 s cap
    finally:
        sender.cancel()
        signal.signal(signal.SIGUSR1, previous)
        step.shutdown(None)
    assert drained, "the loop slept through the shutdown signal until its poll timed out"


def test_the_waker_comes_back_after_the_hub_is_reset(hub: Hub) -> None:
    """A lost broker connection resets the hub (its readers are dropped); the consumer registers its steps again."""
    step = WakeOnShutdown(parent=None)
    step.register_with_event_loop(None, hub)
    hub.reset()
    step.register_with_event_loop(None, hub)
    try:
        assert step.fd in hub.readers
    finally:
        step.shutdown(None)
    assert step.fd is None
