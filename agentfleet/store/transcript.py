"""A run's transcript (the model's context, message by message) and the observations a turn's calls came back with."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection

from agentfleet.loop.transcript import MESSAGES, History, Message, message_chars
from agentfleet.store.base import RunMovedOn, StoreBase
from agentfleet.store.records import now
from agentfleet.store.sql import POSTGRES, Later, Sql, defer, execute

# What a process keeps of runs' complete iterations (and the turn its planner last committed for each), least recently
# planned dropped first: at most this many runs, weighing at most this much in all, as the messages' JSON (what a prompt
# sends; a message's Python objects weigh a small multiple of it). A few long runs of large turns, or one turn of a
# network model's, must not grow a planner without bound; a run heavier than the whole budget is read each time.
TRANSCRIPTS_KEPT = 128
TRANSCRIPT_BYTES_KEPT = 32 * 1024 * 1024
LINEAGES_KEPT = 16  # sources of retried or forked runs whose transcripts a process keeps

LINEAGE_MAX = 32  # runs one lineage may go back through (each retried or forked from the one before)
SOURCE_MESSAGES = Sql("SELECT iteration, CAST(body AS TEXT) FROM messages WHERE run_id = :run_id "
                      "AND iteration <= :through ORDER BY iteration, position")
SOURCE_LINEAGE = Sql("SELECT lineage FROM runs WHERE run_id = :run_id", result=("json",))
NEW_MESSAGES = Sql("SELECT iteration, CAST(body AS TEXT) FROM messages WHERE run_id = :run_id AND iteration > :after "
                   "ORDER BY iteration, position")
RECORD_OBSERVATION = Sql(
    "INSERT INTO observations (run_id, iteration, call_id, tool, result, received_at) "
    "VALUES (:run_id, :iteration, :call_id, :tool, :result, :at) "
    "ON CONFLICT (run_id, iteration, call_id) DO NOTHING RETURNING call_id",
    json=frozenset({"result"}), times=frozenset({"at"}))
# The same, only while the run is at that iteration in one of the given states, its row locked by this statement:
# whether it was, and whether this recorded the result (Postgres; sent with the run's locked read that follows).
OBSERVE_WHILE = Sql(
    "WITH run AS (SELECT run_id FROM runs WHERE run_id = :run_id AND iteration = :iteration "
    "AND state = ANY(:states) FOR UPDATE), noted AS ("
    "INSERT INTO observations (run_id, iteration, call_id, tool, result, received_at) "
    "SELECT run_id, :iteration, :call_id, :tool, :result, :at FROM run "
    "ON CONFLICT (run_id, iteration, call_id) DO NOTHING RETURNING call_id) "
    "SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM noted)",
    json=frozenset({"result"}), times=frozenset({"at"}), rows=True)
# The same, where the handling takes the result to be its call's first (the run's one call, the run held as the
# commit that sent the call out left it: none can have been committed): deferred, and failing the transaction when a
# result of the call is there already (migration 0020's function), so that the handling reads instead (Postgres).
RECORD_FIRST_OBSERVATION = Sql(
    f"WITH noted AS ({RECORD_OBSERVATION.text}) "
    "SELECT agentfleet_moved_on(:run_id) WHERE NOT EXISTS (SELECT 1 FROM noted)",
    json=RECORD_OBSERVATION.json, times=RECORD_OBSERVATION.times, rows=False)
OBSERVATIONS = Sql("SELECT call_id, tool, result FROM observations WHERE run_id = :run_id AND iteration = :iteration",
                   result=(None, None, "json"))
_inserts: dict[int, Sql] = {}


def _insert_messages(count: int) -> Sql:
    """One INSERT of ``count`` messages (their slots already taken: a retried step rewrites none)."""
    stmt = _inserts.get(count)
    if stmt is None:
        rows = ", ".join(f"(:run_id, :i{n}, :p{n}, :b{n})" for n in range(count))
        stmt = _inserts[count] = Sql(f"INSERT INTO messages (run_id, iteration, position, body) VALUES {rows} "
                                     "ON CONFLICT (run_id, iteration, position) DO NOTHING")
    return stmt


@dataclasses.dataclass(frozen=True)
class _Kept:
    """What a process knows of one run's transcript: its messages through iteration ``through``, each of those
    iterations complete, and the turn its planner committed next (iteration, the run's version that commit left, the
    turn as stored) when a plan's commit, not a read, left it so. A read that moves ``through`` on forgets the turn."""

    run_id: str
    through: int
    complete: History
    planned: tuple[int, int, Message] | None = None

    @property
    def weight(self) -> int:
        return self.complete.chars + (message_chars(self.planned[2]) if self.planned else 0)  # remembered per message


class Transcripts(StoreBase):
    """A run's messages and its turn's observations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transcripts: OrderedDict[str, _Kept] = OrderedDict()
        self._transcripts_weight = 0
        self._transcripts_guard = threading.Lock()
        self._lineages: OrderedDict[tuple[str, int], History] = OrderedDict()

    def append_messages(self, conn: Connection, run_id: str, iteration: int, msgs: Sequence[Message],
                        start: int = 0) -> None:
        self.write_messages(conn, run_id, [(iteration, i, m) for i, m in enumerate(msgs, start=start)])

    def write_messages(self, conn: Connection, run_id: str, slots: Sequence[tuple[int, int, Message]]) -> None:
        """Messages into their (iteration, position) slots, in one statement; a slot already written is kept."""
        if not slots:
            return
        values: dict[str, object] = {"run_id": run_id}
        for n, (iteration, position, message) in enumerate(slots):
            values[f"i{n}"], values[f"p{n}"], values[f"b{n}"] = iteration, position, message.model_dump_json()
        defer(conn, _insert_messages(len(slots)), values)

    def messages_at(self, run_id: str, iteration: int) -> list[Message]:
        """One iteration's messages of a run (its own, not its lineage's), in order: the turn, then its results."""
        with self.reading() as conn:
            rows = execute(conn, SOURCE_MESSAGES, {"run_id": run_id, "through": iteration}).rows
        return [Message.model_validate_json(body) for it, body in rows if it == iteration]

    def turn_texts(self, run_id: str, head: int = 500) -> dict[int, str]:
        """What the model said in words at each iteration of a run (the head of its turn's text; a turn of calls
        only has none), for people reading the run. Its own messages, not its lineage's."""
        with self.reading() as conn:
            rows = execute(conn, NEW_MESSAGES, {"run_id": run_id, "after": -1}).rows
        said: dict[int, str] = {}
        for iteration, body in rows:
            try:
                message = Message.model_validate_json(body)
            except ValueError:  # a row that is not a message is not shown (the trace is a view)
                continue
            if message.role == "assistant" and message.content and iteration not in said:
                said[iteration] = message.content[:head]
        return said

    def lineage_history(self, lineage: dict[str, Any] | None) -> History:
        """The transcript a retried or forked run starts from: its source's messages through the iteration its
        lineage names, after the source's own start (recursively). Read by reference, never copied: an ended
        source's messages do not change, so what is read is kept (a few runs' worth)."""
        if not lineage:
            return History()
        key = (str(lineage["run_id"]), int(lineage["through"]))
        with self._transcripts_guard:
            found = self._lineages.get(key)
        if found is not None:
            return found
        chain: list[tuple[str, int]] = []
        source: dict[str, Any] | None = lineage
        with self.reading() as conn:
            while source and len(chain) < LINEAGE_MAX:
                chain.append((str(source["run_id"]), int(source["through"])))
                source = execute(conn, SOURCE_LINEAGE, {"run_id": chain[-1][0]}).scalar()
            history = History()
            for run_id, through in reversed(chain):
                rows = execute(conn, SOURCE_MESSAGES, {"run_id": run_id, "through": through}).rows
                if rows:
                    history = history.plus(MESSAGES.validate_json("[" + ",".join(body for _, body in rows) + "]"))
        with self._transcripts_guard:
            self._lineages[key] = history
            while len(self._lineages) > LINEAGES_KEPT:
                self._lineages.popitem(last=False)
        return history

    def transcript(self, run_id: str, conn: Connection | None = None) -> list[Message]:
        """The run's messages in order (``history``'s)."""
        return self.history(run_id, conn).messages

    def history(self, run_id: str, conn: Connection | None = None) -> History:
        """The run's messages in order, with their sizes and repair count, reading only what is new since this
        process last read the run.

        An iteration's messages are written in two transactions: the model's turn (position 0) when it is
        planned, the results of its calls (positions 1…) with the next iteration's turn. So once a read sees
        iteration ``k``, every iteration before ``k`` is complete and never changes again (a retried step
        rewrites the same slots, ignored): those are kept, per run, and the next read asks only for
        ``iteration >= k``. The cost of planning no longer grows with the run (it read and validated the whole
        transcript every iteration). Rows are read as stored text and validated as one JSON array."""
        done_through, kept = self._kept(run_id)
        params = {"run_id": run_id, "after": done_through}
        if conn is not None:
            rows = execute(conn, NEW_MESSAGES, params).rows
        else:
            with self.reading() as own:
                rows = execute(own, NEW_MESSAGES, params).rows
        return self._grown(run_id, kept, rows)

    def history_later(self, run_id: str, conn: Connection) -> Callable[[], History]:
        """``history``, its read deferred to go with ``conn``'s next round trip (the planner's: with its intent and
        its COMMIT); the history once that is back."""
        done_through, kept = self._kept(run_id)
        later = defer(conn, NEW_MESSAGES, {"run_id": run_id, "after": done_through}, keep=True)
        return lambda: self._grown(run_id, kept, later.rows().rows)

    def _kept(self, run_id: str) -> tuple[int, History]:
        """The iteration through which this process keeps the run's messages, and those messages."""
        with self._transcripts_guard:
            cached = self._transcripts.get(run_id)
        return (cached.through, cached.complete) if cached is not None else (-1, History())

    def _grown(self, run_id: str, kept: History, rows: Sequence[tuple[Any, ...]]) -> History:
        """``kept`` and the messages read after it (``rows``), the complete iterations among them kept."""
        if not rows:
            return kept
        fresh = MESSAGES.validate_json("[" + ",".join(body for _, body in rows) + "]")
        last = rows[-1][0]  # the iteration that may still grow: kept out of the cache
        done = sum(1 for iteration, _ in rows if iteration < last)  # rows come in iteration order
        complete = kept.plus(fresh[:done])
        self._keep(_Kept(run_id, last - 1, complete))
        return complete.plus(fresh[done:])

    def _keep(self, entry: _Kept) -> None:
        """Keep ``entry`` as what this process knows of its run (in place of what it knew), within the bounds."""
        with self._transcripts_guard:
            earlier = self._transcripts.pop(entry.run_id, None)
            self._transcripts_weight -= earlier.weight if earlier else 0
            if earlier is not None and entry.planned is None and earlier.through == entry.through:
                entry = dataclasses.replace(entry, planned=earlier.planned)  # a read, through the same iteration
            if entry.weight > TRANSCRIPT_BYTES_KEPT:
                return
            self._transcripts[entry.run_id] = entry
            self._transcripts_weight += entry.weight
            while len(self._transcripts) > TRANSCRIPTS_KEPT or self._transcripts_weight > TRANSCRIPT_BYTES_KEPT:
                _, dropped = self._transcripts.popitem(last=False)
                self._transcripts_weight -= dropped.weight

    def transcripts_weight(self) -> int:
        """What the transcripts this process keeps weigh now, as their messages' JSON."""
        return self._transcripts_weight

    def keep_planned(self, run_id: str, iteration: int, before: History, turn: Message, version: int) -> None:
        """What the commit of a run's plan of ``iteration`` (which left it at ``version``) leaves its transcript as:
        ``before``, every message of the iterations before (the last one's results were written by that commit), then
        ``turn``. Only once it committed: the next plan of the run in this process then needs no read
        (``planned_history``). The run's own messages only (not a lineage's)."""
        self._keep(_Kept(run_id, iteration - 1, before, (iteration, version, turn)))

    def planned_history(self, run_id: str, iteration: int, versions: Sequence[int]) -> History | None:
        """The run's transcript through the turn of ``iteration``, as this process's planner committed it at one of
        ``versions`` (``keep_planned``), without reading it; None when this process does not know it so. Only a guess
        that the run is still as that commit left it: the commit that uses it holds the run at such a version, which
        no later plan of the run can have committed."""
        with self._transcripts_guard:
            kept = self._transcripts.get(run_id)
        if kept is None or kept.planned is None:
            return None
        planned_at, version, turn = kept.planned
        if planned_at != iteration or version not in versions or kept.through != iteration - 1:
            return None
        return kept.complete.plus([turn])

    def record_observation(self, conn: Connection, *, run_id: str, iteration: int, call_id: str, tool: str,
                           result: dict[str, Any]) -> bool:
        return execute(conn, RECORD_OBSERVATION, {"run_id": run_id, "iteration": iteration, "call_id": call_id,
                                                  "tool": tool, "result": result, "at": now()}).first() is not None

    def record_first_observation(self, conn: Connection, *, run_id: str, iteration: int, call_id: str, tool: str,
                                 result: dict[str, Any]) -> None:
        """``record_observation`` of a result the handling takes to be its call's first, with nothing to wait for: on
        Postgres sent with the transaction's next round trip (its COMMIT). If the call has a result already, the
        transaction fails with ``RunMovedOn`` (raised here on SQLite), nothing it wrote stays, and the caller reads
        the run and the results it has."""
        values = {"run_id": run_id, "iteration": iteration, "call_id": call_id, "tool": tool, "result": result,
                  "at": now()}
        if self.dialect == POSTGRES:
            defer(conn, RECORD_FIRST_OBSERVATION, values)
        elif execute(conn, RECORD_OBSERVATION, values).first() is None:
            raise RunMovedOn(f"call {call_id} of run {run_id} has a result already")

    def observe_while(self, conn: Connection, *, run_id: str, iteration: int, states: Sequence[str], call_id: str,
                      tool: str, result: dict[str, Any]) -> Later | None:
        """``record_observation`` only while the run is at ``iteration`` in one of ``states``, in one statement that
        locks the run's row: deferred, to go with the run's locked read (one round trip instead of two). Its row,
        once back: (whether the run was so, whether this recorded the result). None but on Postgres."""
        if self.dialect != POSTGRES:
            return None
        return defer(conn, OBSERVE_WHILE, {"run_id": run_id, "iteration": iteration, "states": list(states),
                                           "call_id": call_id, "tool": tool, "result": result, "at": now()},
                     keep=True)

    def observations(self, conn: Connection, run_id: str, iteration: int) -> list[dict[str, Any]]:
        """The results received for an iteration's calls: ``call_id``, ``tool``, ``result`` each."""
        rows = execute(conn, OBSERVATIONS, {"run_id": run_id, "iteration": iteration}).rows
        return [{"call_id": c, "tool": t, "result": r} for c, t, r in rows]
