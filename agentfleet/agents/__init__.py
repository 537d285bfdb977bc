"""What agent authors write: ``Agent`` definitions, the registry, limits, and plugins that add agents and tools."""

from agentfleet.agents.registry import Agent, AgentRegistry, Limits, load_agents, registry

__all__ = ["Agent", "AgentRegistry", "Limits", "load_agents", "registry"]
