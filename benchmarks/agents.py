"""Agents the benchmarks drive: a loop of no-op iterations, optionally with fat model turns."""

from __future__ import annotations

import os
import random
import string
import time

from pydantic import BaseModel

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
    Usage,
    register_graph,
    tool,
)

LOOP_GOAL = {
    "type": "object",
    "properties": {
        "iterations": {"type": "integer", "minimum": 1},
        "turn_chars": {"type": "integer", "minimum": 0},
        "nap_s": {"type": "number", "minimum": 0},
        "hold": {"type": "boolean"},
        "gated": {"type": "boolean"},
    },
    "required": ["iterations"],
}
LOOP_RESULT = {"type": "object", "properties": {"iterations": {"type": "integer"}}, "required": ["iterations"]}


@tool(read_only=True)
def noop(step: int) -> dict:
    """Do nothing (the benchmark measures everything around the tool)."""
    return {"step": step}


NAPPING = "nap-{run_id}.pids"  # in the workspace: the pid of each process that began a nap of the run, a line each


@tool(idempotent=True)
def nap(ctx: ToolContext, seconds: float, step: int = 0) -> dict:
    """Sleep, so a worker can be killed mid-step; idempotent, so it is run again after a kill. Says which process
    naps (``NAPPING``): its first attempt writes no intent, so the steps table cannot say who runs it."""
    with ctx.resolve(NAPPING.format(run_id=ctx.run_id)).open("a") as pids:
        pids.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return {"slept": seconds}


RELEASE_FILE = "release"


@tool(idempotent=True, timeout_s=3600)
def hold(ctx: ToolContext, step: int = 0) -> dict:
    """A slow tool: waits until the benchmark drops a ``release`` file in the workspace."""
    release = ctx.resolve(RELEASE_FILE)
    while not release.exists():
        time.sleep(0.05)
    return {"held": step}


@tool(requires_approval=True)
def gated(step: int = 0) -> dict:
    """A call a person approves first (the approvals benchmark parks runs on it)."""
    return {"approved": step}


class LoopModel:
    """Answers instantly: a tool call per iteration (with ``turn_chars`` of text), then a final answer."""

    name = "bench-loop"
    offline = True
    longest_call_s = 1.0  # microseconds of string work: well inside a second

    def complete(self, request: ModelRequest) -> ModelTurn:
        goal = request.goal
        # Letters at random: model text does not compress to nothing the way "xxxx…" would.
        rng = random.Random(f"{request.run_id}/{request.iteration}")
        text = "".join(rng.choices(string.ascii_letters + "     ", k=int(goal.get("turn_chars", 0))))
        usage = Usage(output_tokens=len(text) // 4 + 1)
        if request.iteration + 1 >= goal["iterations"]:
            return ScriptedModel.final({"iterations": request.iteration + 1}).model_copy(update={"usage": usage})
        # A new argument each iteration: the same call repeated would (rightly) trip NO_PROGRESS.
        step = request.iteration
        if goal.get("hold"):
            call = ToolCall(id="n", name="hold", arguments={"step": step})
        elif goal.get("gated"):
            call = ToolCall(id="n", name="gated", arguments={"step": step})
        elif goal.get("nap_s"):
            call = ToolCall(id="n", name="nap", arguments={"seconds": goal["nap_s"], "step": step})
        else:
            call = ToolCall(id="n", name="noop", arguments={"step": step})
        return ModelTurn(text=text or None, tool_calls=[call], usage=usage, model=self.name)


# A loop agent's limits: never what ends a benchmark's run.
LOOP_LIMITS = Limits(max_steps=10_000, max_tokens=10**12, max_cost_usd=10**6, deadline_s=10**6)

bench_loop = Agent("bench_loop", instructions="Benchmark loop.", model=LoopModel(), goal_schema=LOOP_GOAL,
                   result_schema=LOOP_RESULT, tools=[noop, nap, hold, gated], limits=LOOP_LIMITS)


class SmallWindowModel(LoopModel):
    """``LoopModel`` declaring a small window: its runs are compacted from the twelfth turn or so on."""

    name = "bench-loop-small-window"
    context_window = 4096


# The growth suite's run past its window: what compacting older turns costs a plan, late in a run as early.
bench_window = Agent("bench_window", instructions="Benchmark loop with a small window.", model=SmallWindowModel(),
                     goal_schema=LOOP_GOAL, result_schema=LOOP_RESULT, tools=[noop], limits=LOOP_LIMITS)


def _delegate_held(request: ModelRequest) -> ModelTurn:
    """A parent that hands its one call to a child run that holds (the slow child of the delegation suite)."""
    if request.iteration == 0:
        return ScriptedModel.calls(ToolCall(id="child", name="delegate", arguments={
            "agent": "bench_loop", "input": {"iterations": 2, "hold": True}}))
    return ScriptedModel.final({"iterations": request.iteration + 1})


bench_parent = Agent(
    "bench_parent",
    instructions="Benchmark parent: waits on one slow child.",
    model=ScriptedModel([_delegate_held, _delegate_held], name="scripted:bench-parent"),
    goal_schema={"type": "object"},
    result_schema=LOOP_RESULT,
    delegates=["bench_loop"],
    limits=Limits(max_steps=100, max_tokens=10**12, max_cost_usd=10**6, deadline_s=10**6),
)


class LoopState(BaseModel):
    step: int = 0
    limit: int


def _hop(state: LoopState) -> dict:
    return {}


def _count(state: LoopState) -> dict:
    return {"step": state.step + 1}


# The overhead suite's LangGraph peer as an agentfleet graph: plan → tool → observe, round and round, each node a
# no-op function checkpointed as a step (benchmarks/suites/graphs.py).
bench_graph = register_graph(
    Graph("bench_graph", state=LoopState, limits=Limits(max_steps=10_000, deadline_s=10**6))
    .node("plan", _hop).node("tool", _hop).node("observe", _count, reads=["step"], writes=["step"])
    .edge(START, "plan")
    .edge("plan", "tool", when=lambda s: s.step < s.limit, label="step < limit")
    .edge("plan", END, when=lambda s: s.step >= s.limit, label="done")
    .edge("tool", "observe").edge("observe", "plan"))
