"""Model adapters: the protocol, hosted and local models on their official SDKs, replayed cassettes, and
scripted turns for tests.

``OpenAIModel`` and ``AnthropicModel`` are imported on first use: their SDKs take a second to import,
which a CLI command or an agent on a cassette should not pay.
"""

from typing import TYPE_CHECKING, Any

from agentfleet.models.base import Model, ModelRequest
from agentfleet.models.pricing import ModelPrice
from agentfleet.models.replay import Cassette, ReplayModel
from agentfleet.models.retrying import RetryingModel, RetryPolicy
from agentfleet.models.scripted import ScriptedModel
from agentfleet.models.spec import model_from_spec

if TYPE_CHECKING:
    from agentfleet.models.anthropic_messages import AnthropicModel
    from agentfleet.models.openai_chat import OpenAIModel

__all__ = ["AnthropicModel", "Cassette", "Model", "ModelPrice", "ModelRequest", "OpenAIModel", "ReplayModel",
           "RetryPolicy", "RetryingModel", "ScriptedModel", "model_from_spec"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIModel":
        from agentfleet.models.openai_chat import OpenAIModel

        return OpenAIModel
    if name == "AnthropicModel":
        from agentfleet.models.anthropic_messages import AnthropicModel

        return AnthropicModel
    raise AttributeError(name)
