"""Server-Sent Events: each live page holds one stream that says *that* its view changed, never what changed —
the page re-fetches its fragment, rendered and masked as any page is.

A change is heard two ways: a notice on ``<ns>.public`` (at once: run ends, approvals, and step notices when the
fleet announces steps, ``AGENTFLEET_STEP_EVENTS`` or a goal's ``progress``), and a cheap look at the checkpoint
every ``CHECK_S`` (one indexed read: the newest run, a trace's run versions, the pending approvals' ids), so a
page is right within a second even for a run that announces nothing, or while the broker is away.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse

from agentfleet.console.live import Heard
from agentfleet.console.rendering import NO_STORE, console_of
from agentfleet.ops.approvals import pending_mark
from agentfleet.ops.runs import newest_mark, tree_mark

if TYPE_CHECKING:
    from agentfleet.store.repository import Store

CHECK_S = 1.0  # how often a stream looks at the checkpoint for changes no notice told of
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing a quiet stream
SETTLE_S = 0.2  # notices in a burst (a step's three) are told as one change


class SharedLooks:
    """One look at the checkpoint per view and second, however many pages show that view: a hundred people on
    the runs list cost the database what one does."""

    def __init__(self, fresh_s: float = CHECK_S * 0.9) -> None:
        self.fresh_s = fresh_s
        self._seen: dict[Hashable, tuple[float, Hashable]] = {}
        self._lock = threading.Lock()

    def peek(self, key: Hashable) -> Any:
        with self._lock:
            found = self._seen.get(key)
        return None if found is None else found[1]

    def look(self, key: Hashable, store: Store, look: Callable[[Store], Hashable]) -> Hashable:
        with self._lock:
            found = self._seen.get(key)
        if found is not None and time.monotonic() - found[0] < self.fresh_s:
            return found[1]
        value = look(store)
        with self._lock:
            self._seen[key] = (time.monotonic(), value)
            if len(self._seen) > 1000:  # views nobody watches any more
                cutoff = time.monotonic() - 60
                self._seen = {k: v for k, v in self._seen.items() if v[0] > cutoff}
        return value


LOOKS = SharedLooks()


def _stream(request: Request, key: Hashable, look: Callable[[Store], Hashable], hears: Callable[[Heard], bool]
            ) -> StreamingResponse:
    console = console_of(request)

    def shared(store: Store) -> Hashable:
        return LOOKS.look(key, store, look)

    async def events() -> AsyncIterator[str]:
        sub = console.feed.subscribe()
        try:
            seen = await run_in_threadpool(shared, console.rt.store)
            yield "retry: 2000\n\n"
            last_check = last_sent = time.monotonic()
            while not await request.is_disconnected():
                changed = False
                try:
                    heard = await asyncio.wait_for(sub.queue.get(), timeout=CHECK_S)
                    changed = heard is None or hears(heard)
                except TimeoutError:
                    pass
                if changed:
                    await asyncio.sleep(SETTLE_S)
                    while not sub.queue.empty():
                        sub.queue.get_nowait()
                if time.monotonic() - last_check >= CHECK_S or changed:
                    last_check = time.monotonic()
                    now_seen = await run_in_threadpool(shared, console.rt.store)
                    changed = changed or now_seen != seen
                    seen = now_seen
                if changed:
                    last_sent = time.monotonic()
                    yield f"event: changed\ndata: {json.dumps({'at': time.time()})}\n\n"
                elif time.monotonic() - last_sent >= KEEPALIVE_S:
                    last_sent = time.monotonic()
                    yield ": keepalive\n\n"
        finally:
            console.feed.unsubscribe(sub)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**NO_STORE, "X-Accel-Buffering": "no"})


def runs_events(request: Request) -> StreamingResponse:
    """The runs list: a new run, or a run of the first page moving on."""
    return _stream(request, "runs", newest_mark, lambda h: h.type.startswith(("run.", "step.", "tool.", "approval.")))


def run_events(request: Request) -> StreamingResponse:
    """One run's page: anything said of the runs of its trace (its tree)."""
    run_id = request.path_params["run_id"]
    key = ("run", run_id)

    def hears(h: Heard) -> bool:
        seen = LOOKS.peek(key)  # (the run's trace id, its tree's mark), from the latest look
        return h.run_id == run_id or (h.trace_id is not None and seen is not None and h.trace_id == seen[0])

    return _stream(request, key, lambda store: tree_mark(store, run_id), hears)


def approvals_events(request: Request) -> StreamingResponse:
    """The approvals page: a request asked or answered."""
    return _stream(request, "approvals", pending_mark, lambda h: h.type.startswith("approval."))
