"""agentfleet: LLM agents as a fleet of message-driven workers, checkpointed step by step.

The public API is what this module exports; ``tests/test_public_api.py`` pins it.
"""

from agentfleet.agents.plugins import Plugin
from agentfleet.agents.registry import Agent
from agentfleet.config.settings import Settings
from agentfleet.context.budget import ContextBudget
from agentfleet.errors import (
    AgentfleetError,
    ErrorCode,
    GoalRejected,
    ModelAuthError,
    ModelError,
    ModelUnavailable,
    ToolError,
    TransientToolError,
)
from agentfleet.events.contracts import Goal, Result, ResultStatus
from agentfleet.events.domain import Trigger, domain_event
from agentfleet.graphs import END, START, Graph, append, maximum, merge, minimum, reducer, register_graph
from agentfleet.loop.budgets import Limits
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall, ToolResult, Usage
from agentfleet.models import model_from_spec
from agentfleet.models.base import Model, ModelRequest
from agentfleet.models.replay import ReplayModel
from agentfleet.models.retrying import RetryingModel, RetryPolicy
from agentfleet.models.scripted import ScriptedModel
from agentfleet.sandbox.options import ResourceLimits, Sandbox
from agentfleet.tools.health import HealthCheck, health_check
from agentfleet.tools.manifest import load_tool_folder, load_tool_manifest, subprocess_tool
from agentfleet.tools.policy import ApprovalRule
from agentfleet.tools.tool import Tool, ToolCancelled, ToolContext, tool

__version__ = "0.1.0"

__all__ = [
    "END",
    "START",
    "Agent",
    "AgentfleetError",
    "AnthropicModel",
    "ApprovalRule",
    "Client",
    "ContextBudget",
    "ErrorCode",
    "Goal",
    "GoalRejected",
    "Graph",
    "HealthCheck",
    "Limits",
    "Message",
    "Model",
    "ModelAuthError",
    "ModelError",
    "ModelRequest",
    "ModelTurn",
    "ModelUnavailable",
    "OpenAIModel",
    "Plugin",
    "ReplayModel",
    "ResourceLimits",
    "Result",
    "ResultStatus",
    "RetryPolicy",
    "RetryingModel",
    "Sandbox",
    "ScriptedModel",
    "Settings",
    "Tool",
    "ToolCall",
    "ToolCancelled",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "TransientToolError",
    "Trigger",
    "Usage",
    "__version__",
    "append",
    "domain_event",
    "health_check",
    "load_tool_folder",
    "load_tool_manifest",
    "maximum",
    "merge",
    "minimum",
    "model_from_spec",
    "reducer",
    "register_graph",
    "subprocess_tool",
    "tool",
]


def __getattr__(name: str) -> object:
    """The SDK-backed models load on first use (see agentfleet.models), and the client with Celery and kombu."""
    if name == "Client":
        from agentfleet.ops.client import Client

        return Client
    if name in ("OpenAIModel", "AnthropicModel"):
        from agentfleet import models

        return getattr(models, name)
    raise AttributeError(name)
