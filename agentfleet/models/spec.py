"""Models named by a string, so settings can choose an agent's model without a code change.

``openai:gpt-4.1-mini`` · ``anthropic:claude-sonnet-4-5`` ·
``openai-compatible:http://127.0.0.1:8080/v1:qwen2.5-0.5b`` (any Chat Completions server; the key is
``OPENAI_API_KEY`` when set, none otherwise) · ``anthropic-compatible:http://127.0.0.1:8080:model`` ·
``replay:path/to/run.cassette.json``.
"""

from __future__ import annotations

import re

from agentfleet.errors import ConfigurationError
from agentfleet.models.base import Model

# A URL up to its path's end (a host's port is before the first "/"), then ":" and the model's name, which
# may hold ":" itself (Ollama's "qwen2.5:0.5b").
_URL_AND_MODEL = re.compile(r"^(https?://[^/]+(?:/[^:]*)?):(.+)$")
KINDS = ("openai", "anthropic", "openai-compatible", "anthropic-compatible", "replay")


def model_from_spec(spec: str) -> Model:
    """The model a spec string names; a ``ConfigurationError`` saying the accepted forms otherwise."""
    kind, _, rest = spec.strip().partition(":")
    if not rest:
        forms = ", ".join(k + ":…" for k in KINDS)
        raise ConfigurationError(f"model spec {spec!r} names no model; use one of: {forms}")
    if kind == "openai":
        from agentfleet.models.openai_chat import OpenAIModel

        return OpenAIModel(rest)
    if kind == "anthropic":
        from agentfleet.models.anthropic_messages import AnthropicModel

        return AnthropicModel(rest)
    if kind in ("openai-compatible", "anthropic-compatible"):
        match = _URL_AND_MODEL.match(rest)
        if not match:
            raise ConfigurationError(f"model spec {spec!r}: expected {kind}:http://HOST:PORT/PATH:MODEL")
        url, model = match.groups()
        if kind == "openai-compatible":
            from agentfleet.models.openai_chat import OpenAIModel

            return OpenAIModel(model, base_url=url, api_key_env=None)
        from agentfleet.models.anthropic_messages import AnthropicModel

        return AnthropicModel(model, base_url=url, api_key_env=None)
    if kind == "replay":
        from agentfleet.models.replay import ReplayModel

        return ReplayModel(rest)
    raise ConfigurationError(f"model spec {spec!r}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
