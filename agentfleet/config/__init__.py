"""Settings, profiles, and agent declarations."""

from agentfleet.config.agents import Agent, AgentRegistry, Limits, load_agents, registry
from agentfleet.config.settings import Profile, Settings, get_settings

__all__ = ["Agent", "AgentRegistry", "Limits", "Profile", "Settings", "get_settings", "load_agents", "registry"]
