"""What the console hears on ``<ns>.public`` is input: anything a publisher put there is read strictly, and a page
that stops reading its stream is dropped notices, never memory."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentfleet.console.live import SUBSCRIBER_BACKLOG, Heard, Subscription


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b"null", json.dumps({"type": 7}).encode(),
                                 json.dumps({"run_id": "r"}).encode(), b"\xff\xfe", None, 12])
def test_a_notice_that_is_not_one_is_ignored(raw: object) -> None:
    assert Heard.of(raw) is None


def test_only_the_type_and_the_ids_cross_over_and_odd_ids_are_dropped() -> None:
    heard = Heard.of(json.dumps({"type": "approval.requested" + "x" * 500, "run_id": "r1", "trace_id": ["t"],
                                 "arguments": {"token": "s3cret"}}).encode())
    assert heard == Heard(type=("approval.requested" + "x" * 500)[:64], run_id="r1", trace_id=None)


def test_a_stream_that_falls_behind_loses_notices_not_memory() -> None:
    async def flood() -> int:
        sub = Subscription(asyncio.get_running_loop())
        for i in range(SUBSCRIBER_BACKLOG * 3):
            sub.offer(Heard(type=f"run.{i}"))
        return sub.queue.qsize()

    assert asyncio.run(flood()) == SUBSCRIBER_BACKLOG


def test_many_pages_of_one_view_cost_one_look_a_second() -> None:
    from agentfleet.console.streams import SharedLooks

    looks = SharedLooks(fresh_s=60)
    calls: list[int] = []

    def look(store: object) -> int:
        calls.append(1)
        return len(calls)

    assert [looks.look("runs", None, look) for _ in range(100)] == [1] * 100  # type: ignore[arg-type]
    assert looks.look("approvals", None, look) == 2  # type: ignore[arg-type]
    assert looks.peek("runs") == 1 and looks.peek("nothing") is None
    assert SharedLooks(fresh_s=0).look("runs", None, look) == 3  # type: ignore[arg-type]
