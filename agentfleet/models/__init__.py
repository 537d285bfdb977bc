"""Model adapters: the protocol, replayed cassettes, and scripted turns for tests."""

from agentfleet.models.base import Model, ModelRequest
from agentfleet.models.replay import Cassette, ReplayModel
from agentfleet.models.scripted import ScriptedModel

__all__ = ["Cassette", "Model", "ModelRequest", "ReplayModel", "ScriptedModel"]
