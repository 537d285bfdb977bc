"""OpenAI Chat Completions with tool calling, on the official ``openai`` SDK, for any server that speaks it:
hosted OpenAI, vLLM, Ollama, llama.cpp's ``llama-server``, a LiteLLM proxy.

The final answer is a function tool like the others (``final_answer``), not the structured-output mode:
it works on every server that does tool calling, and lets the model finish in the same turn shape as it
acts. Quirks of local servers are tolerated: an empty ``content`` beside tool calls, missing call ids,
arguments that are not JSON (told back to the model, see loop/decisions.py).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai

from agentfleet.loop.transcript import Message, ModelTurn, ToolCall
from agentfleet.models.base import ModelRequest
from agentfleet.models.provider import ProviderModel, priced, read_arguments

log = logging.getLogger(__name__)
# Context windows of known models (tokens); others default to DEFAULT_CONTEXT_WINDOW or what is passed.
CONTEXT_WINDOWS = {"gpt-4.1": 1_047_576, "gpt-4o": 128_000, "gpt-5": 400_000}
DEFAULT_CONTEXT_WINDOW = 8_192


class OpenAIModel(ProviderModel[openai.OpenAI]):
    """A model behind an OpenAI-compatible Chat Completions endpoint.

    ``OpenAIModel("gpt-4.1-mini")`` calls OpenAI with ``OPENAI_API_KEY``;
    ``OpenAIModel("qwen2.5-0.5b", base_url="http://127.0.0.1:8080/v1", api_key_env=None)`` a local server
    that needs no key. A missing key is a ``ConfigurationError`` naming the variable, raised when the agent
    is declared (worker start-up), not at the first call. Calls are not retried here: the planner's one
    retry layer does that, per error.
    """

    provider = "openai"
    key_env = "OPENAI_API_KEY"

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, temperature: float | None = None, max_output_tokens: int | None = None,
                 context_window: int | None = None, extra_body: dict[str, Any] | None = None,
                 tool_choice: str | None = None, llama_server_tokenizer: bool = False,
                 text_tool_calls: bool = False) -> None:
        window = context_window or next(
            (n for prefix, n in CONTEXT_WINDOWS.items() if model.startswith(prefix)), DEFAULT_CONTEXT_WINDOW)
        super().__init__(model, base_url=base_url, api_key_env=api_key_env, temperature=temperature,
                         max_output_tokens=max_output_tokens, context_window=window,
                         client=lambda key: openai.OpenAI(api_key=key, base_url=base_url, max_retries=0,
                                                          timeout=timeout_s),
                         text_tool_calls=text_tool_calls)
        self.extra_body = extra_body
        # "required": every turn must be a tool call (``final_answer`` is one), which llama-server enforces
        # with a grammar: a small model can then not answer in prose or write a call as text.
        self.tool_choice = tool_choice
        self._tokens = LlamaServerTokens(base_url, timeout_s) if llama_server_tokenizer and base_url else None

    def count_tokens(self, messages: list[Message], tools: list[dict[str, Any]]) -> int | None:
        """The prompt's tokens on the model's own tokenizer, when the server offers one (llama-server), else
        None: the planner's heuristic then decides alone."""
        if self._tokens is None:
            return None
        return self._tokens.count(to_openai(messages), [{"type": "function", "function": s} for s in tools])

    def complete(self, request: ModelRequest) -> ModelTurn:
        params: dict[str, Any] = {"model": self.model, "messages": to_openai(request.messages)}
        if request.tools:
            params["tools"] = [{"type": "function", "function": spec} for spec in request.tools]
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.max_output_tokens is not None:
            params["max_completion_tokens"] = self.max_output_tokens
        if self.extra_body:
            params["extra_body"] = self.extra_body
        if self.tool_choice and request.tools:
            params["tool_choice"] = self.tool_choice
        try:
            response = self._client.get().chat.completions.create(**params)
        except (openai.OpenAIError, ValueError) as exc:  # ValueError: a body cut off mid-JSON
            return self.failed(exc)
        return self.read_text_calls(from_openai(response, self.name, self.model, request.iteration), request.tools,
                                    request.iteration)


class LlamaServerTokens:
    """Exact prompt counts from llama.cpp's server: the chat template applied as the server will apply it
    (``/apply-template``), then tokenized (``/tokenize``, special tokens parsed). Two local requests; a failure
    is no count (the heuristic stands), never a failed turn."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.timeout_s = min(timeout_s, 30.0)

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int | None:
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        try:
            with httpx.Client(timeout=self.timeout_s) as client:
                prompt = client.post(f"{self.root}/apply-template", json=body).raise_for_status().json()["prompt"]
                tokens = client.post(f"{self.root}/tokenize", json={"content": prompt}).raise_for_status().json()
            return len(tokens["tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("llama-server could not count the prompt: %s", exc)
            return None


def to_openai(messages: list[Message]) -> list[dict[str, Any]]:
    """The transcript as Chat Completions messages: calls and results matched by id."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            said: dict[str, Any] = {"role": "assistant", "content": m.content or ""}
            if m.tool_calls:
                said["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)}}
                    for c in m.tool_calls
                ]
            out.append(said)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""})
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def from_openai(response: Any, name: str, model: str, iteration: int) -> ModelTurn:
    """A completion as a turn. A call without an id gets one unique in the run (``i<iteration>c<n>``)."""
    if not response.choices:
        return ModelTurn(model=name, stop_reason="empty")
    choice = response.choices[0]
    message = choice.message
    calls, malformed = [], {}
    for n, call in enumerate(message.tool_calls or []):
        function = getattr(call, "function", None)
        if function is None:
            continue
        call_id = (call.id or "")[:128] or f"i{iteration}c{n}"
        arguments, problem = read_arguments(function.arguments)
        calls.append(ToolCall(id=call_id, name=(function.name or "(unnamed)")[:128], arguments=arguments))
        if problem:
            malformed[call_id] = problem
    usage = response.usage
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None) or 0
    spent = priced(model, getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0,
                   cached)
    return ModelTurn(text=message.content or None, tool_calls=calls, usage=spent, model=name,
                     stop_reason=choice.finish_reason, malformed=malformed)
