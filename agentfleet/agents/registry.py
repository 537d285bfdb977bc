"""Declaring agents: name, instructions, goal and result schemas, tools, model, limits.

Creating an ``Agent`` registers it; workers import the modules listed in
``AGENTFLEET_AGENTS`` at start-up so every process knows the same agents.
"""

from __future__ import annotations

import copy
import importlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agentfleet.agents.plugins import load_plugins
from agentfleet.constants import DELEGATE_TOOL, FINAL_ANSWER_TOOL, READ_ARTIFACT_TOOL
from agentfleet.context.budget import ContextBudget
from agentfleet.context.counting import ToolSpecs, spec_chars
from agentfleet.errors import ConfigurationError
from agentfleet.events.domain import Trigger
from agentfleet.loop.budgets import Limits
from agentfleet.loop.decisions import schema_problem
from agentfleet.loop.transcript import Message
from agentfleet.tools.artifacts import read_artifact
from agentfleet.tools.delegate import delegate_tool
from agentfleet.tools.policy import ApprovalRule, check_rules
from agentfleet.tools.tool import Tool

if TYPE_CHECKING:
    from agentfleet.config.settings import Settings
    from agentfleet.models.base import Model

Schema = dict[str, Any] | type[BaseModel]


def _as_schema(schema: Schema, what: str, agent: str) -> dict[str, Any]:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    if not isinstance(schema, dict):
        raise ConfigurationError(f"agent {agent!r}: {what} must be a JSON Schema dict or a pydantic model")
    problem = schema_problem(schema)
    if problem is not None:
        raise ConfigurationError(f"agent {agent!r}: {what} is not a valid JSON Schema: {problem}")
    return schema


# Names of the fleet's own tools: an agent's tool of the same name would replace one silently.
RESERVED_TOOLS = frozenset({FINAL_ANSWER_TOOL, DELEGATE_TOOL, READ_ARTIFACT_TOOL})


def _built_in(t: Tool) -> bool:
    """The fleet's own read_artifact, which an agent may list itself."""
    return t is read_artifact


class Agent:
    """An agent: what it is for, the model that decides, the tools it may call, and its limits.

    Declared once, at import of a module named in ``AGENTFLEET_AGENTS``; every worker that
    imports the module knows the agent by ``name``, and goals reach it on routing key
    ``goal.<name>``.

    * ``instructions``: the system prompt.
    * ``model``: any ``Model`` (``complete(ModelRequest) -> ModelTurn``) — ``OpenAIModel`` (any
      Chat Completions server), ``AnthropicModel``, ``ReplayModel`` (a cassette), ``ScriptedModel``
      (tests) — or a spec string such as ``"openai:gpt-4.1-mini"`` (models/spec.py).
      ``AGENTFLEET_MODELS`` may swap it per agent without a code change.
    * ``goal_schema`` / ``result_schema``: JSON Schemas. A goal whose input breaks the first is
      refused (``INPUT_INVALID``) before a run starts; the run ends when the model calls the
      ``final_answer`` tool, succeeding with those arguments when they satisfy the second. An answer
      that does not (or prose, an empty turn, arguments that are not JSON) is told back to the model
      with what was wrong, up to ``Limits.max_repairs`` times a run, then fails (``OUTPUT_INVALID``).
    * ``tools``: functions declared with ``@tool``.
    * ``limits``: steps, tokens, cost and deadline (``Limits``); a goal may tighten them.
    * ``approval_rules``: ``ApprovalRule`` s asking a person about (or denying) calls by their
      arguments.
    * ``examples``: a worked exchange (``Message`` s: a goal, calls, their results) shown before the
      goal. Small local models call tools reliably only after seeing one.
    * ``context``: a ``ContextBudget`` (window, output reserve, each part's budget); ``summary_model``: who
      summarises older turns when they no longer fit — ``None`` (one extractive line each), ``"agent"`` (its
      own model), or another model.
    * ``retention_days``: how long its ended runs are kept before retention deletes them (default:
      ``AGENTFLEET_RETENTION_DAYS``; unset there too, for ever).

    Example::

        from agentfleet import Agent, Limits, ReplayModel, tool

        @tool(read_only=True)
        def word_count(text: str) -> dict:
            \"\"\"Count the words of a text.\"\"\"
            return {"words": len(text.split())}

        counter = Agent(
            "counter", instructions="Count the words of the goal's text.",
            model=ReplayModel("counter.cassette.json"),
            goal_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            result_schema={"type": "object", "properties": {"words": {"type": "integer"}}},
            tools=[word_count], limits=Limits(max_steps=4),
        )

    An unknown option is a configuration error, as is a second, different agent of the same name.
    """

    def __init__(
        self,
        name: str,
        *,
        instructions: str,
        model: Model | str,
        goal_schema: Schema,
        result_schema: Schema,
        tools: Sequence[Tool] = (),
        limits: Limits | None = None,
        approval_rules: Sequence[ApprovalRule] = (),
        examples: Sequence[Message] = (),
        delegates: Sequence[str] = (),
        triggers: Sequence[Trigger] = (),
        context: ContextBudget | None = None,
        summary_model: Model | str | None = None,
        retention_days: float | None = None,
        register: bool = True,
        **unknown: Any,
    ) -> None:
        """``approval_rules`` ask a person about (or deny) calls of this agent's tools by their arguments;
        rules in ``AGENTFLEET_APPROVAL_RULES`` apply to every agent as well."""
        if unknown:
            raise ConfigurationError(f"agent {name!r}: unknown option(s) {', '.join(sorted(unknown))}; known: "
                                     "instructions, model, goal_schema, result_schema, tools, limits, "
                                     "approval_rules, examples, delegates, triggers, context, summary_model, "
                                     "retention_days, register")
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigurationError(f"agent name {name!r} must be letters, digits, '_' or '-'")
        self.name = name
        self.instructions = instructions
        if retention_days is not None and (isinstance(retention_days, bool)
                                           or not isinstance(retention_days, int | float) or not retention_days > 0):
            raise ConfigurationError(f"agent {name!r}: retention_days must be a number of days above 0")
        # How long its ended runs are kept (None: AGENTFLEET_RETENTION_DAYS); agentfleet.ops.retention deletes them.
        self.retention_days = retention_days
        if isinstance(model, str):
            from agentfleet.models.spec import model_from_spec

            model = model_from_spec(model)
        self.model = model
        self.goal_schema = _as_schema(goal_schema, "goal_schema", name)
        self.result_schema = _as_schema(result_schema, "result_schema", name)
        self._final_chars: tuple[object, int] = (None, 0)  # the final-answer tool's size, for this result schema
        self.limits = limits or Limits()
        if context is not None and not isinstance(context, ContextBudget):
            raise ConfigurationError(f"agent {name!r}: context takes a ContextBudget (agentfleet.ContextBudget)")
        self.context = context or ContextBudget()
        # Who writes the running summary of older turns: None, the extractive lines (free, deterministic);
        # "agent", the agent's own model; or another, cheaper model (or its spec string). A model's summary is
        # recorded with the plan step, kept incrementally, and replaced by the lines whenever it fails.
        if isinstance(summary_model, str) and summary_model != "agent":
            from agentfleet.models.spec import model_from_spec

            summary_model = model_from_spec(summary_model)
        self._summary_model = summary_model
        self.examples = _checked_examples(examples, name)
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ConfigurationError(f"agent {name!r}: tool name {t.name!r} is repeated")
            if t.name in RESERVED_TOOLS and not _built_in(t):
                raise ConfigurationError(f"agent {name!r}: tool name {t.name!r} is reserved for the fleet's own "
                                         f"tool (it would replace it); rename the tool")
            self.tools[t.name] = t
        if not all(isinstance(t, Trigger) for t in triggers):
            raise ConfigurationError(f"agent {name!r}: triggers takes Trigger objects (agentfleet.Trigger)")
        self.triggers: tuple[Trigger, ...] = tuple(triggers)
        self.delegates: tuple[str, ...] = tuple(delegates)
        if self.delegates:
            for other in self.delegates:
                if not isinstance(other, str) or not other.replace("_", "").replace("-", "").isalnum():
                    raise ConfigurationError(f"agent {name!r}: delegates names agents, not {other!r}")
            self.tools[DELEGATE_TOOL] = delegate_tool(self.delegates)
        if any(t.leaves_artifacts for t in self.tools.values()) and READ_ARTIFACT_TOOL not in self.tools:
            self.tools[READ_ARTIFACT_TOOL] = read_artifact  # how its model reads what did not fit in a result
        for t in self.tools.values():
            if t.fallback is not None and t.fallback not in self.tools:
                raise ConfigurationError(f"agent {name!r}: tool {t.name!r} falls back to {t.fallback!r}, which is "
                                         "not one of its tools (add it to tools=[...])")
        self.approval_rules = check_rules(approval_rules, self.tools, f"agent {name!r}")
        # Whether a call of this agent can ever wait for a person by its own declarations (settings may add
        # rules for every agent): the observer skips looking for parked calls when none can be.
        self.asks_approval = bool(self.approval_rules) or any(t.requires_approval for t in self.tools.values())
        if register:
            registry.add(self)

    @property
    def summary_model(self) -> Model | None:
        """The model that writes the running summary, if any (``"agent"``: whichever model the agent has now)."""
        found = self._summary_model
        return self.model if found == "agent" else found  # type: ignore[return-value]

    def tool(self, name: str) -> Tool | None:
        """The tool a call of this agent names. ``read_artifact`` is every agent's: a context that compacted an
        old tool result offers it, to read that result back whole (``result:<call id>``, its own run's only)."""
        found = self.tools.get(name)
        return read_artifact if found is None and name == READ_ARTIFACT_TOOL else found

    def callable(self) -> list[str]:
        """The names a model's call may use (what ``tool`` resolves)."""
        return [*self.tools, *([] if READ_ARTIFACT_TOOL in self.tools else [READ_ARTIFACT_TOOL])]

    def tool_specs(self, offered: Sequence[str] | None = None) -> ToolSpecs:
        """What the model is offered: the agent's tools (those named in ``offered``, when given) plus the
        final-answer tool, each with its size measured once (``ToolSpecs``)."""
        final = {
            "name": FINAL_ANSWER_TOOL,
            "description": "Finish the run with this result. Call it alone, once.",
            "parameters": self.result_schema,
        }
        schema, chars = self._final_chars
        if schema is not self.result_schema:
            self._final_chars = (self.result_schema, chars := spec_chars(final))
        tools = self.tools.values() if offered is None else [self.tools[n] for n in offered if n in self.tools]
        return ToolSpecs([*(t.spec() for t in tools), final], sum(t.spec_chars for t in tools) + chars)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={list(self.tools)})"


def _checked_examples(examples: Sequence[Message], agent: str) -> tuple[Message, ...]:
    """A worked exchange the way providers accept it: every call answered by id before the next turn."""
    out = tuple(examples)
    asked: set[str] = set()
    for message in out:
        if not isinstance(message, Message):
            raise ConfigurationError(f"agent {agent!r}: examples must be Message objects, got {type(message).__name__}")
        if message.role == "tool":
            asked.discard(message.tool_call_id or "")
        elif asked:
            raise ConfigurationError(f"agent {agent!r}: example calls {sorted(asked)} have no tool message answering")
        asked |= {c.id for c in message.tool_calls}
    if asked:
        raise ConfigurationError(f"agent {agent!r}: example calls {sorted(asked)} have no tool message answering")
    return out


class AgentRegistry:
    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._lock = threading.Lock()

    def add(self, agent: Agent) -> None:
        """Register an agent; a second, different agent of the same name is a configuration error (it would
        silently replace the first in this process, and workers would disagree on what the name means)."""
        with self._lock:
            if self._agents.get(agent.name) not in (None, agent):
                raise ConfigurationError(f"agent {agent.name!r} is declared twice; "
                                         "agent names are unique in a fleet")
            self._agents[agent.name] = agent

    def get(self, name: str) -> Agent | None:
        return self._agents.get(name)

    def names(self) -> list[str]:
        return sorted(self._agents)

    def all(self) -> list[Agent]:
        return [self._agents[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._agents

    def tool_queues(self) -> tuple[str, ...]:
        """The dedicated queues the agents' tools name (``@tool(queue=...)``), in name order."""
        return tuple(sorted({t.queue for a in self.all() for t in a.tools.values() if t.queue}))

    def triggered_by(self, event: str) -> list[tuple[Agent, Trigger]]:
        """The agents a domain event starts, each with its trigger, in name order."""
        return [(a, t) for a in self.all() for t in a.triggers if t.event == event]

    def replaced(self, name: str, model: Model) -> AgentRegistry:
        """A copy in which agent ``name`` (a copy of it) uses ``model``: the CLI's recording and replay."""
        view = AgentRegistry()
        view._agents = dict(self._agents)
        if name in view._agents:
            view._agents[name] = copy.copy(view._agents[name])
            view._agents[name].model = model
        return view

    def with_models(self, models: Mapping[str, str], wrap: Callable[[Model], Model] | None = None) -> AgentRegistry:
        """A copy whose agents named in ``models`` (``"*"``: all) use the model their spec names, and whose
        models ``wrap`` wraps. The declared agents are left as they are: settings choose models per process,
        not per import."""
        from agentfleet.models.spec import model_from_spec

        unknown = set(models) - {"*"} - set(self._agents)
        if unknown:
            raise ConfigurationError(f"AGENTFLEET_MODELS names agents not loaded: {', '.join(sorted(unknown))}")
        view = AgentRegistry()
        for agent in self.all():
            spec = models.get(agent.name, models.get("*"))
            if spec or wrap:
                agent = copy.copy(agent)
                model = model_from_spec(spec) if spec else agent.model
                agent.model = wrap(model) if wrap else model
            view._agents[agent.name] = agent
        return view


registry = AgentRegistry()


def fleet_agents(settings: Settings, wrap: Callable[[Model], Model] | None = None) -> AgentRegistry:
    """The fleet's agents as settings say: plugins first (in the order they require), then the agent modules."""
    load_plugins(settings.plugin_folders, settings.disabled_plugins, entry_points=settings.plugin_entry_points)
    return load_agents(settings.agent_modules, settings.models, wrap)


def load_agents(modules: Iterable[str], models: Mapping[str, str] | None = None,
                wrap: Callable[[Model], Model] | None = None) -> AgentRegistry:
    """Import the modules that declare agents (idempotent: Python caches imports), then give the agents
    named in ``models`` (``AGENTFLEET_MODELS``; ``"*"``: all) the model their spec string names, each model
    passed through ``wrap`` (the fleet's rate limit)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import agents module {module!r}: {exc}") from exc
        except Exception as exc:  # a wrong declaration: one line naming the module and the fault, exit 2
            raise ConfigurationError(f"agents module {module!r} failed while declaring its agents: "
                                     f"{type(exc).__name__}: {exc}") from exc
    for agent in registry.all():
        missing = [d for d in agent.delegates if d not in registry]
        if missing:
            raise ConfigurationError(f"agent {agent.name!r} delegates to {', '.join(map(repr, missing))}, which no "
                                     f"loaded module declares (loaded: {', '.join(registry.names())})")
        if agent.delegates:  # now that they are all known: tell its model what each delegate takes
            agent.tools[DELEGATE_TOOL] = delegate_tool(agent.delegates, {
                d: (other.instructions, other.goal_schema) for d in agent.delegates
                if (other := registry.get(d)) is not None})
    return registry.with_models(models or {}, wrap) if models or wrap else registry
