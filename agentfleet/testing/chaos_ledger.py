"""``chaos_ledger``: an agent whose side effects are counted, for ``agentfleet chaos``.

Its one real tool appends a row to the ``chaos_ledger`` table of the fleet's own database,
in its own transaction, half-way through a call that sleeps on both sides of the write:
a worker killed in the first half never wrote, one killed in the second half wrote but
never recorded the step's outcome. The table has no unique constraint on purpose: a
second execution of one call is counted, never hidden. Beside the third write it reads the
ledger (``ledger_read``: idempotent, so its first attempt writes no intent, and a kill mid-read
runs it again). Its model is scripted: two calls in parallel, then a write and a read, then
the final answer with what the tools said.

``chaos_graph`` makes the same writes as a graph (``agentfleet chaos --agent chaos_graph``): nodes ``a`` and ``b``
at once, joined into ``c``. A node whose write's outcome is unknown (its worker died mid-call) is skipped, never
tried again: the graph goes on without it, and the ledger shows no second write.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Annotated, Any

from pydantic import BaseModel, Field
from sqlalchemy import Column, DateTime, Engine, Integer, MetaData, String, Table, func, insert, select

from agentfleet import (
    END,
    START,
    Agent,
    Graph,
    Limits,
    ModelRequest,
    ModelTurn,
    ScriptedModel,
    ToolCall,
    ToolContext,
    append,
    register_graph,
    tool,
)
from agentfleet.config.settings import get_settings
from agentfleet.store.db import make_engine

metadata = MetaData()
ledger = Table(
    "chaos_ledger", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("call_id", String(128), nullable=False),
    Column("idempotency_key", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("written_at", DateTime(timezone=True), server_default=func.now()),
)
_engines: dict[str, Engine] = {}
_guard = threading.Lock()


def ledger_engine(url: str | None = None) -> Engine:
    """The engine of the ledger's database (the fleet's own), with the table created on first use."""
    url = url or get_settings().effective_database_url
    with _guard:
        if url not in _engines:
            engine = make_engine(url)
            metadata.create_all(engine, checkfirst=True)
            _engines[url] = engine
        return _engines[url]


@tool(timeout_s=20)
def ledger_write(ctx: ToolContext, entry: Annotated[str, Field(max_length=100)],
                 delay_s: Annotated[float, Field(ge=0, le=10)] = 0.4) -> dict[str, Any]:
    """Append an entry to the ledger (a side effect that is not idempotent)."""
    time.sleep(delay_s / 2)
    with ledger_engine().begin() as conn:
        conn.execute(insert(ledger).values(run_id=ctx.run_id, call_id=ctx.call_id, attempt=ctx.attempt,
                                           idempotency_key=ctx.idempotency_key, pid=os.getpid()))
    time.sleep(delay_s / 2)
    return {"written": entry}


@tool(idempotent=True, timeout_s=20)
def ledger_read(ctx: ToolContext, delay_s: Annotated[float, Field(ge=0, le=10)] = 0.4) -> dict[str, Any]:
    """Count the run's ledger rows (no side effect: run again after a kill, never UNKNOWN_OUTCOME)."""
    time.sleep(delay_s / 2)
    with ledger_engine().connect() as conn:
        rows = conn.execute(select(func.count()).select_from(ledger).where(ledger.c.run_id == ctx.run_id)).scalar()
    time.sleep(delay_s / 2)
    return {"rows": int(rows or 0)}


def _first(request: ModelRequest) -> ModelTurn:
    delay = float(request.goal.get("delay_s", 0.4))
    return ScriptedModel.calls(ToolCall(id="a", name="ledger_write", arguments={"entry": "a", "delay_s": delay}),
                               ToolCall(id="b", name="ledger_write", arguments={"entry": "b", "delay_s": delay}))


def _second(request: ModelRequest) -> ModelTurn:
    delay = float(request.goal.get("delay_s", 0.4))
    return ScriptedModel.calls(ToolCall(id="c", name="ledger_write", arguments={"entry": "c", "delay_s": delay}),
                               ToolCall(id="r", name="ledger_read", arguments={"delay_s": delay}))


def _answer(request: ModelRequest) -> ModelTurn:
    outputs = request.tool_outputs()
    return ScriptedModel.final({"results": [outputs[k] for k in sorted(outputs)]})


chaos_ledger = Agent(
    "chaos_ledger",
    instructions="Write two ledger entries at once, then a third beside a read, then report what the tools said.",
    # Its turns are made at once: the planner may ask for them before writing anything (chaos then kills it there).
    model=ScriptedModel([_first, _second, _answer], name="scripted:chaos-ledger", longest_call_s=0.1),
    goal_schema={"type": "object", "properties": {"n": {"type": "integer"},
                                                  "delay_s": {"type": "number", "minimum": 0, "maximum": 10}},
                 "additionalProperties": False},
    result_schema={"type": "object", "properties": {"results": {"type": "array"}}, "required": ["results"]},
    tools=[ledger_write, ledger_read],
    limits=Limits(max_steps=6, deadline_s=600),
)


class LedgerState(BaseModel):
    n: int = 0
    delay_s: float = Field(default=0.4, ge=0, le=10)
    results: Annotated[list[Any], append] = []


def _node(entry: str) -> dict[str, Any]:
    return {"tool": ledger_write, "reads": ["delay_s"], "writes": ["results"], "on_failure": "skip",
            "input": lambda s: {"entry": entry, "delay_s": s.delay_s}, "output": lambda out: {"results": [out]}}


chaos_graph = register_graph(
    Graph("chaos_graph", state=LedgerState, inputs=["n", "delay_s"], limits=Limits(max_steps=6, deadline_s=600))
    .node("a", **_node("a")).node("b", **_node("b")).node("c", **_node("c"))
    .fan_out(START, ["a", "b"]).join(["a", "b"], "c").edge("c", END))
