"""The model's context under a budget: parts with budgets of their own, counting, layered compaction."""

from agentfleet.context.assemble import Assembled, Overflow, assemble
from agentfleet.context.budget import Budgets, ContextBudget, Part
from agentfleet.context.builder import estimate_tokens, goal_message, system_prompt
from agentfleet.context.counting import Heuristic

__all__ = ["Assembled", "Budgets", "ContextBudget", "Heuristic", "Overflow", "Part", "assemble", "estimate_tokens",
           "goal_message", "system_prompt"]
