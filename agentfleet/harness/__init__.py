"""Tools: declaration (``@tool``), validation, and running them into structured results."""

from agentfleet.harness.runner import run_tool
from agentfleet.tools.tool import Tool, ToolContext, tool

__all__ = ["Tool", "ToolContext", "run_tool", "tool"]
