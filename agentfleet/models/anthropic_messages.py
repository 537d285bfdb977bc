"""Anthropic Messages with tool use, on the official ``anthropic`` SDK.

The transcript maps onto Messages' stricter shape: system messages become the ``system`` parameter, an
assistant turn's calls become ``tool_use`` blocks, and the tool results that answer them (with any note
after them) one user message of ``tool_result`` blocks, so roles alternate as the API requires.
"""

from __future__ import annotations

import logging
from typing import Any

import anthropic

from agentfleet.errors import ConfigurationError
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall
from agentfleet.models.base import ModelRequest
from agentfleet.models.provider import ProviderModel, priced, read_arguments

# Messages' stop reasons in the loop's (OpenAI's) words.
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                "refusal": "content_filter", "pause_turn": "stop"}
CONTEXT_WINDOW = 200_000
# tool_choice in the words OpenAIModel takes, said in Messages' vocabulary.
TOOL_CHOICES = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}
log = logging.getLogger(__name__)


class AnthropicModel(ProviderModel[anthropic.Anthropic]):
    """A Claude model (or any server speaking Anthropic's ``/v1/messages``).

    ``AnthropicModel("claude-sonnet-4-5")`` uses ``ANTHROPIC_API_KEY``; a missing key is a
    ``ConfigurationError`` naming it, raised when the agent is declared. ``max_output_tokens`` is required
    by the API and defaults to 4096. Calls are not retried here (the planner's retry layer does).
    ``tool_choice`` takes OpenAIModel's words (``"required"``: every turn is a call, ``final_answer`` is one).
    ``exact_counts`` counts each assembled prompt with ``/v1/messages/count_tokens`` (Anthropic's API and
    llama-server both offer it) before it is sent: one more request per turn, for a count on the model's own
    tokenizer instead of the heuristic's.
    """

    provider = "anthropic"
    key_env = "ANTHROPIC_API_KEY"

    def __init__(self, model: str, *, base_url: str | None = None, api_key_env: str | None = "ANTHROPIC_API_KEY",
                 timeout_s: float = 60.0, temperature: float | None = None, max_output_tokens: int = 4096,
                 context_window: int = CONTEXT_WINDOW, text_tool_calls: bool = False,
                 extra_body: dict[str, Any] | None = None, user_text_apart: bool = False,
                 tool_choice: str | None = None, exact_counts: bool = False) -> None:
        if tool_choice is not None and tool_choice not in TOOL_CHOICES:
            raise ConfigurationError(f"AnthropicModel: tool_choice must be one of {sorted(TOOL_CHOICES)}, "
                                     f"not {tool_choice!r}")
        super().__init__(model, base_url=base_url, api_key_env=api_key_env, temperature=temperature,
                         max_output_tokens=max_output_tokens, context_window=context_window,
                         client=lambda key: anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0,
                                                                timeout=timeout_s),
                         text_tool_calls=text_tool_calls)
        self.max_output_tokens: int = max_output_tokens  # required by Messages: never None here
        self.extra_body = extra_body
        # A user turn's text (the goal after a worked example's last result, a repair note) in a user message of its
        # own after the tool results: llama-server's /v1/messages turns a message into its text first and its tool
        # results after (tools/server/server-chat.cpp), so a small model saw the goal before the example had ended
        # and answered with a <tool_response> of its own. Off by default: Anthropic's API takes the one message.
        self.user_text_apart = user_text_apart
        self.tool_choice = tool_choice
        self.exact_counts = exact_counts

    def _prompt(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """What a call sends of the prompt (system, messages, tools): a count must see the same."""
        system, said = to_anthropic(messages, user_text_apart=self.user_text_apart)
        params: dict[str, Any] = {"model": self.model, "messages": said}
        if system:
            params["system"] = system
        if tools:
            params["tools"] = [{"name": t["name"], "description": t.get("description") or "",
                                "input_schema": t.get("parameters") or {"type": "object"}} for t in tools]
            if self.tool_choice:
                params["tool_choice"] = TOOL_CHOICES[self.tool_choice]
        return params

    def count_tokens(self, messages: list[Message], tools: list[dict[str, Any]]) -> int | None:
        """The prompt's tokens as the server counts them (``exact_counts``), else None: the planner's heuristic
        then decides alone. A failed count is no count, never a failed turn."""
        if not self.exact_counts:
            return None
        try:
            return int(self._client.get().messages.count_tokens(**self._prompt(messages, tools)).input_tokens)
        except (anthropic.AnthropicError, ValueError, TypeError) as exc:
            log.warning("%s could not count the prompt: %s", self.name, exc)
            return None

    def complete(self, request: ModelRequest) -> ModelTurn:
        params = self._prompt(request.messages, request.tools)
        params["max_tokens"] = self.max_output_tokens
        extra = dict(self.extra_body or {})
        if self.temperature is not None:  # in the body: recent SDKs dropped the parameter, servers still read it
            extra["temperature"] = self.temperature
        if extra:
            params["extra_body"] = extra
        try:
            response = self._client.get().messages.create(**params)
        except (anthropic.AnthropicError, ValueError) as exc:  # ValueError: a body cut off mid-JSON
            return self.failed(exc)
        return self.read_text_calls(from_anthropic(response, self.name, self.model), request.tools,
                                    request.iteration)


def to_anthropic(messages: list[Message], user_text_apart: bool = False) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages): consecutive user-side content (tool results, notes, the goal) is one user
    message, as Messages wants roles to alternate; with ``user_text_apart``, text after tool results starts a
    user message of its own."""
    system = "\n\n".join(m.content or "" for m in messages if m.role == "system")
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls]
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "(no answer)"}]})
            continue
        if m.role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content or ""}
            if '"ok": false' in (m.content or ""):
                block["is_error"] = True
        else:
            block = {"type": "text", "text": m.content or ""}
        after_results = block["type"] == "text" and out and any(b["type"] == "tool_result" for b in out[-1]["content"])
        if out and out[-1]["role"] == "user" and not (user_text_apart and after_results):
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return system, out


def from_anthropic(response: Any, name: str, model: str) -> ModelTurn:
    texts, calls, malformed = [], [], {}
    for block in response.content or []:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            arguments, problem = read_arguments(block.input)
            calls.append(ToolCall(id=block.id[:128], name=block.name[:128], arguments=arguments))
            if problem:
                malformed[block.id[:128]] = problem
    usage = response.usage
    cache_read = getattr(usage, "cache_read_input_tokens", None) or 0
    cache_write = getattr(usage, "cache_creation_input_tokens", None) or 0
    spent = priced(model, (usage.input_tokens or 0) + cache_read + cache_write, usage.output_tokens or 0, cache_read)
    return ModelTurn(text="".join(texts) or None, tool_calls=calls, usage=spent, model=name,
                     stop_reason=STOP_REASONS.get(response.stop_reason or "", response.stop_reason),
                     malformed=malformed)
