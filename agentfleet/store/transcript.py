"""A run's transcript (the model's context, message by message) and the observations a turn's calls came back with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Text, cast, select

from agentfleet.loop.transcript import MESSAGES, Message
from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import now


class Transcripts(StoreBase):
    """A run's messages and its turn's observations."""

    def append_messages(self, conn: Connection, run_id: str, iteration: int, msgs: Sequence[Message],
                        start: int = 0) -> None:
        for i, message in enumerate(msgs, start=start):
            self._insert_ignore(
                conn, T.messages,
                dict(run_id=run_id, iteration=iteration, position=i, body=message.model_dump(mode="json")),
                ["run_id", "iteration", "position"],
            )

    def transcript(self, run_id: str) -> list[Message]:
        """The run's messages in order. Read as stored text and validated as one JSON array: the
        planner reads the whole transcript every iteration, and a decode plus ``model_validate``
        per row was a third of its CPU (benchmarks/README.md, profile)."""
        with self.engine.connect() as conn:
            bodies = conn.execute(
                select(cast(T.messages.c.body, Text))
                .where(T.messages.c.run_id == run_id)
                .order_by(T.messages.c.iteration, T.messages.c.position)
            ).scalars().all()
        return MESSAGES.validate_json("[" + ",".join(bodies) + "]")

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
