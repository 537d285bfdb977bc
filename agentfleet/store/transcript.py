"""A run's transcript (the model's context, message by message) and the observations a turn's calls came back with."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Text, cast, select

from agentfleet.loop.transcript import MESSAGES, Message
from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import now

# What a process keeps of runs' complete iterations, least recently planned dropped first: at most this many runs,
# and this many messages in all (a few long runs of large turns must not grow a planner without bound).
TRANSCRIPTS_KEPT = 128
MESSAGES_KEPT = 20_000


class Transcripts(StoreBase):
    """A run's messages and its turn's observations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transcripts: OrderedDict[str, tuple[int, list[Message]]] = OrderedDict()
        self._messages_kept = 0
        self._transcripts_guard = threading.Lock()

    def append_messages(self, conn: Connection, run_id: str, iteration: int, msgs: Sequence[Message],
                        start: int = 0) -> None:
        for i, message in enumerate(msgs, start=start):
            self._insert_ignore(
                conn, T.messages,
                dict(run_id=run_id, iteration=iteration, position=i, body=message.model_dump(mode="json")),
                ["run_id", "iteration", "position"],
            )

    def transcript(self, run_id: str) -> list[Message]:
        """The run's messages in order, reading only what is new since this process last read the run.

        An iteration's messages are written in two transactions: the model's turn (position 0) when it is
        planned, the results of its calls (positions 1…) with the next iteration's turn. So once a read sees
        iteration ``k``, every iteration before ``k`` is complete and never changes again (a retried step
        rewrites the same slots, ignored): those are kept, per run, and the next read asks only for
        ``iteration >= k``. The cost of planning no longer grows with the run (it read and validated the whole
        transcript every iteration). Rows are read as stored text and validated as one JSON array."""
        with self._transcripts_guard:
            cached = self._transcripts.get(run_id)
        done_through, kept = cached if cached is not None else (-1, [])
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(T.messages.c.iteration, cast(T.messages.c.body, Text))
                .where(T.messages.c.run_id == run_id, T.messages.c.iteration > done_through)
                .order_by(T.messages.c.iteration, T.messages.c.position)
            ).all()
        fresh = MESSAGES.validate_json("[" + ",".join(body for _, body in rows) + "]")
        if rows:
            last = rows[-1][0]  # the iteration that may still grow: kept out of the cache
            complete = [m for (iteration, _), m in zip(rows, fresh, strict=True) if iteration < last]
            with self._transcripts_guard:
                earlier = self._transcripts.pop(run_id, None)
                self._messages_kept -= len(earlier[1]) if earlier else 0
                self._transcripts[run_id] = (last - 1, [*kept, *complete])
                self._messages_kept += len(kept) + len(complete)
                while self._transcripts and (len(self._transcripts) > TRANSCRIPTS_KEPT
                                             or self._messages_kept > MESSAGES_KEPT):
                    _, (_, dropped) = self._transcripts.popitem(last=False)
                    self._messages_kept -= len(dropped)
        return [*kept, *fresh]

    def record_observation(self, conn: Connection, *, run_id: str, iteration: int, call_id: str, tool: str,
                           result: dict[str, Any]) -> bool:
        return self._insert_ignore(
            conn, T.observations,
            dict(run_id=run_id, iteration=iteration, call_id=call_id, tool=tool, result=result, received_at=now()),
            ["run_id", "iteration", "call_id"],
        )

    def observations(self, conn: Connection, run_id: str, iteration: int) -> list[dict[str, Any]]:
        rows = conn.execute(
            select(T.observations)
            .where(T.observations.c.run_id == run_id, T.observations.c.iteration == iteration)
        ).all()
        return [dict(r._mapping) for r in rows]
