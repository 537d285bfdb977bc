"""The hook seam (DESIGN §12): what steps, tool calls, model calls and run transitions pass through."""

from agentfleet.hooks.base import Hook, Hooks, ModelCallInfo, StepInfo, ToolCallInfo, Transition

__all__ = ["Hook", "Hooks", "ModelCallInfo", "StepInfo", "ToolCallInfo", "Transition"]
