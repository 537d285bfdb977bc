"""A graph on the fleet: an agent whose turns the graph decides, not a model.

``register_graph(graph)`` makes the graph an ``Agent`` of its name: goals reach it on ``goal.<name>``, it answers on
``reply_to`` and on the public exchange like any agent, and its runs are checkpointed, cancelled, limited and
traced by the same code. Its model is the graph (``GraphModel``): each turn it works out the position from the
run's record (graphs/runner.py) and answers with the next step's nodes as tool calls, or with the state as the
final answer. A function node is a tool of the graph that an executor runs (``node_<name>``); a tool node calls
its tool; an agent or graph node is a ``delegate`` call, so it is a child run whose spend counts in the graph's
budget. The planner shows the graph the whole record, never a compacted context (``whole_transcript``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from typing import Any

from agentfleet.agents.registry import Agent
from agentfleet.constants import DELEGATE_TOOL, FINAL_ANSWER_TOOL
from agentfleet.errors import ErrorCode, ModelError, ToolError
from agentfleet.graphs.definition import Graph, Node
from agentfleet.graphs.runner import (
    FROM_KEY,
    Activation,
    GraphFailed,
    Outcome,
    Position,
    advance,
    node_input,
    node_writes,
    start,
    takes_item,
)
from agentfleet.graphs.state import view
from agentfleet.graphs.validation import check
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall, Usage
from agentfleet.models.base import ModelRequest
from agentfleet.tools.options import ToolOptions
from agentfleet.tools.policy import ApprovalRule
from agentfleet.tools.tool import Tool, ToolContext, declare

NODE_TOOL_PREFIX = "node_"
MEMO_RUNS = 4096  # runs whose position a graph keeps, per process (a few KB each)
NODE_RESPONSE_LIMIT = 1_000_000  # characters of a node's writes: state, not a model's reading


class GraphError(ModelError):
    """The graph ended its run (graphs/runner.py ``GraphFailed``): a code of its own, never retried."""

    def __init__(self, failed: GraphFailed) -> None:
        super().__init__(failed.message)
        self.code = failed.code  # type: ignore[misc]


class GraphModel:
    """The graph in a model's place: one request in (the run's record), one turn out (the next nodes)."""

    offline = False
    whole_transcript = True  # the planner shows it every message, uncompacted: the record is the position

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.name = f"graph:{graph.name}"
        # Where each run was after the record this process last read (the record only grows): the next step goes
        # on from there instead of replaying the run from its start, so a step costs the same at step 1,000 as at
        # step 1. Another process, or a record that does not go on from it, replays from the start.
        self._memo: OrderedDict[str, tuple[int, Message, Position]] = OrderedDict()
        self._lock = threading.Lock()

    def estimate(self, request: ModelRequest) -> Usage:
        return Usage()  # a graph's turn spends no tokens

    def _resume(self, run_id: str, messages: list[Message]) -> tuple[int, Position] | None:
        with self._lock:
            held = self._memo.get(run_id)
        if held is None:
            return None
        count, last, position = held
        return (count, position) if 0 < count <= len(messages) and messages[count - 1] == last else None

    def _remember(self, run_id: str, messages: list[Message], position: Position) -> None:
        if not messages:
            return
        with self._lock:
            self._memo[run_id] = (len(messages), messages[-1], position)
            self._memo.move_to_end(run_id)
            while len(self._memo) > MEMO_RUNS:
                self._memo.popitem(last=False)

    def complete(self, request: ModelRequest) -> ModelTurn:
        try:
            position = replay(self.graph, request.goal, request.messages,
                              resume=self._resume(request.run_id, request.messages))
            self._remember(request.run_id, request.messages, position)
            calls = [_call(self.graph, position, a, request.iteration, i) for i, a in enumerate(position.due)]
        except GraphFailed as exc:
            raise GraphError(exc) from None
        said = json.dumps({"graph": self.graph.name, "step": request.iteration, "path": position.path[-1:]},
                          default=str, sort_keys=True)
        if not calls:
            output = {k: v for k, v in position.state.items() if k in self.graph.output}
            calls = [ToolCall(id=f"{request.iteration}.end", name=FINAL_ANSWER_TOOL, arguments=output)]
        return ModelTurn(text=said, tool_calls=calls, model=self.name, stop_reason="tool_calls")


def replay(graph: Graph, goal: dict[str, Any], messages: list[Message],
           points: list[tuple[int, str, dict[str, Any]]] | None = None,
           resume: tuple[int, Position] | None = None) -> Position:
    """The position after every step the record holds: each step's calls must be the ones the graph makes
    (else the graph changed under the run: ``GRAPH_CHANGED``), and their results move it on. ``points`` collects
    (step, node, the state it was due with) on the way; ``resume``: the position after ``messages[:n]``, to go on
    from."""
    begin, position = resume if resume is not None else (0, start(graph, goal))
    news = messages[begin:]
    results = {m.tool_call_id: m.content for m in news if m.role == "tool" and m.tool_call_id}
    for message in news:
        if message.role != "assistant" or not message.tool_calls:
            continue
        if any(c.name == FINAL_ANSWER_TOOL for c in message.tool_calls):
            continue  # an answer refused (it would not be, from the graph): the record goes on past it
        step = _step_of(message.tool_calls[0].id)
        expected = [a.call_id(step, i) for i, a in enumerate(position.due)] if step is not None else []
        recorded = [c.id for c in message.tool_calls]
        if recorded != expected:
            raise GraphFailed(ErrorCode.GRAPH_CHANGED,
                              f"the run recorded the calls {recorded[:5]} where the graph as loaded makes "
                              f"{expected[:5]}: the graph changed under the run (start it again)")
        assert step is not None
        if points is not None:
            points += [(step, node, dict(position.state)) for node in dict.fromkeys(a.node for a in position.due)]
        outcomes = {a.call_id(step, i): _outcome(graph.nodes[a.node], results.get(a.call_id(step, i)))
                    for i, a in enumerate(position.due)}
        position = advance(graph, position, step, outcomes)
    return position


def replay_points(graph: Graph, goal: dict[str, Any], messages: list[Message]) -> list[tuple[int, str, dict[str, Any]]]:
    """(step, node, the state when it was due) for each node of each recorded step: where a fork may start. A step
    the run failed at is a point; nothing after it is."""
    points: list[tuple[int, str, dict[str, Any]]] = []
    with contextlib.suppress(GraphFailed):
        replay(graph, goal, messages, points)
    return points


def _step_of(call_id: str) -> int | None:
    head = call_id.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _outcome(node: Node, content: str | None) -> Outcome:
    """A node's result as recorded (read strictly: a tool's output is input)."""
    try:
        said = json.loads(content) if content else None
    except ValueError:
        said = None
    if not isinstance(said, dict) or not isinstance(said.get("ok"), bool):
        return Outcome(code=ErrorCode.INTERNAL, message=f"the result recorded for node {node.name!r} is unreadable")
    if not said["ok"]:
        return Outcome(code=str(said.get("error_code") or ErrorCode.INTERNAL), message=str(said.get("message") or ""))
    output = said.get("output")
    if node.kind == "agent":
        output = output.get("output") if isinstance(output, dict) else None
    return node_writes(node, output)


def _call(graph: Graph, position: Position, a: Activation, step: int, index: int) -> ToolCall:
    node = graph.nodes[a.node]
    call_id = a.call_id(step, index)
    if node.kind == "function":
        arguments: dict[str, Any] = {"state": {f: position.state.get(f) for f in node.reads}, "attempt": a.attempt,
                                     "delay_s": node.policy.delay_s(a.attempt)}
        if a.has_item:
            arguments["item"] = a.item
        return ToolCall(id=call_id, name=node_tool_name(node), arguments=arguments)
    given = node_input(node, position.state, graph, a)
    if node.kind == "tool":
        assert node.tool is not None
        return ToolCall(id=call_id, name=node.tool.name, arguments=given)
    return ToolCall(id=call_id, name=DELEGATE_TOOL, arguments={"agent": node.agent, "input": given})


def node_tool_name(node: Node) -> str:
    return f"{NODE_TOOL_PREFIX}{node.name}"


NODE_ARGUMENTS = {
    "type": "object",
    "properties": {"state": {"type": "object"}, "item": {}, "attempt": {"type": "integer", "minimum": 1},
                   "delay_s": {"type": "number", "minimum": 0}},
    "required": ["state"],
    "additionalProperties": False,
}


def node_tool(graph: Graph, node: Node) -> Tool:
    """A function node as the tool an executor runs: it waits out its backoff (a cancel ends the wait), hands
    the function the state's fields it reads (reading another is an error), and refuses a write it did not
    declare (``UNDECLARED_WRITE``) before anything is recorded."""
    func = node.func
    assert func is not None
    with_item = takes_item(func)

    def run(ctx: ToolContext, state: dict[str, Any], item: Any = None, attempt: int = 1,
            delay_s: float = 0.0) -> dict[str, Any]:
        if delay_s > 0 and _waited_out(ctx, delay_s) is False:
            raise ToolError(f"node {node.name!r} was stopped while it waited to try again", code=ErrorCode.CANCELLED)
        shown = view(graph.state, state, node.reads)
        try:
            written = func(shown, item) if with_item else func(shown)
        except AttributeError as exc:
            if exc.obj is shown:  # type: ignore[attr-defined]
                raise ToolError(f"node {node.name!r} read {exc.name!r}, which it does not declare "
                                f"(reads={list(node.reads)})", code=ErrorCode.UNDECLARED_READ) from None
            raise
        if written is None:
            written = {}
        if hasattr(written, "model_dump"):
            written = written.model_dump(mode="json", exclude_unset=True)
        if not isinstance(written, dict):
            raise ToolError(f"node {node.name!r} returned {type(written).__name__}; a node returns the fields it "
                            "writes, as a dict", code=ErrorCode.NODE_FAILED)
        undeclared = sorted(set(written) - set(node.writes))
        if undeclared:
            raise ToolError(f"node {node.name!r} wrote {', '.join(map(repr, undeclared))}, which it does not "
                            f"declare (writes={list(node.writes)})", code=ErrorCode.UNDECLARED_WRITE)
        return json.loads(json.dumps(written, default=str))

    options = ToolOptions(timeout_s=node.policy.timeout_s, response_limit=NODE_RESPONSE_LIMIT)
    about = f"Graph {graph.name!r}, node {node.name!r}" + (f": {node.description}" if node.description else "")
    return declare(node_tool_name(node), about, NODE_ARGUMENTS, options, func=run, context_param="ctx",
                   source=getattr(func, "__module__", None))


BACKOFF_SLICE_S = 0.25  # how often a backoff wait asks whether its run was cancelled (a stop mark in Redis)


def _waited_out(ctx: ToolContext, delay_s: float) -> bool:
    """Wait ``delay_s`` (at most to the run's deadline) unless the call is stopped first: a cancel of the run is a
    stop mark the context reads (``ctx.cancelled``), not an event it is told, so it is asked every slice. False:
    stopped."""
    until = time.monotonic() + ctx.time_left(delay_s)
    while (left := until - time.monotonic()) > 0:
        if ctx.cancelled:
            return False
        ctx.stopped.wait(min(BACKOFF_SLICE_S, left))
    return not ctx.cancelled


def goal_schema(graph: Graph) -> dict[str, Any]:
    """The state's schema with only the graph's inputs required, and ``_from`` (a fork's starting node)."""
    schema = graph.state.model_json_schema()
    schema["required"] = [f for f in graph.inputs if f in graph.state.model_fields]
    schema.setdefault("properties", {})[FROM_KEY] = {"type": "string", "enum": sorted(graph.nodes),
                                                     "description": "start at this node (a fork)"}
    return schema


def result_schema(graph: Graph) -> dict[str, Any]:
    schema = graph.state.model_json_schema()
    schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k in graph.output}
    schema["required"] = [f for f in schema.get("required", []) if f in graph.output]
    return schema


def register_graph(graph: Graph, *, register: bool = True) -> Agent:
    """The graph, checked (``ConfigurationError`` listing every problem), as the agent the fleet runs, known to
    every process that imports the module declaring it (``AGENTFLEET_AGENTS``), like an agent."""
    check(graph)
    tools: list[Tool] = []
    rules: list[ApprovalRule] = []
    delegates: list[str] = []
    for node in graph.nodes.values():
        if node.kind == "function":
            tools.append(node_tool(graph, node))
        elif node.kind == "tool":
            assert node.tool is not None
            if all(t.name != node.tool.name for t in tools):
                tools.append(node.tool)
        elif node.agent not in delegates:
            delegates.append(str(node.agent))
        if node.policy.requires_approval:
            reason = f"graph {graph.name!r} asks before node {node.name!r} runs"
            if node.kind == "agent":
                rules.append(ApprovalRule(tool=DELEGATE_TOOL, match={"agent": f"^{node.agent}$"}, reason=reason))
            else:
                rules.append(ApprovalRule(tool=node.tool.name if node.tool else node_tool_name(node), reason=reason))
    agent = Agent(graph.name, instructions=graph.description or f"The graph {graph.name}.",
                  model=GraphModel(graph), goal_schema=goal_schema(graph), result_schema=result_schema(graph),
                  tools=tools, limits=graph.limits, approval_rules=rules, delegates=delegates, register=register)
    agent.graph = graph  # type: ignore[attr-defined]
    return agent
