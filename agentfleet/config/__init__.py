"""Settings and profiles: what a process runs with, from the environment and ``.env``."""

from agentfleet.config.settings import Profile, Settings, get_settings

__all__ = ["Profile", "Settings", "get_settings"]
