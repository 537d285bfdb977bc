"""Building the model's context under a token budget."""

from agentfleet.context.builder import build_messages, estimate_tokens, goal_message, system_prompt

__all__ = ["build_messages", "estimate_tokens", "goal_message", "system_prompt"]
