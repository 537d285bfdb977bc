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
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import TYPE_CHECKING

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


def _stream(request: Request, look: Callable[[Store], Hashable], hears: Callable[[Heard], bool]) -> StreamingResponse:
    console = console_of(request)

    async def events() -> AsyncIterator[str]:
        sub = console.feed.subscribe()
        try:
            seen = await run_in_threadpool(look, console.rt.store)
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
                    now_seen = await run_in_threadpool(look, console.rt.store)
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
    return _stream(request, newest_mark, lambda h: h.type.startswith(("run.", "step.", "tool.", "approval.")))


def run_events(request: Request) -> StreamingResponse:
    """One run's page: anything said of the runs of its trace (its tree)."""
    run_id = request.path_params["run_id"]
    trace: dict[str, str | None] = {"id": None}

    def look(store: Store) -> Hashable:
        trace["id"], mark = tree_mark(store, run_id)
        return mark

    def hears(h: Heard) -> bool:
        return h.run_id == run_id or (h.trace_id is not None and h.trace_id == trace["id"])

    return _stream(request, look, hears)


def approvals_events(request: Request) -> StreamingResponse:
    """The approvals page: a request asked or answered."""
    return _stream(request, pending_mark, lambda h: h.type.startswith("approval."))
