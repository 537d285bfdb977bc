"""What the hosted-model adapters share: keys from the environment, SDK errors sorted into the two kinds
the retry layer knows, tool arguments read defensively, and usage priced.

Both official SDKs raise the same shapes (``APIStatusError`` with ``status_code`` and the response's
headers, ``APITimeoutError``, ``APIConnectionError``), so one translation serves both. Their own retries
are turned off (``max_retries=0``): models/retrying.py is the one layer that retries.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Collection
from typing import Any, Generic, TypeVar

from agentfleet.errors import ConfigurationError, ModelAuthError, ModelError, ModelUnavailable
from agentfleet.loop.transcript import ModelTurn, ToolCall, Usage
from agentfleet.models.pricing import price_overrides, usage_of

C = TypeVar("C")

# Statuses worth another try: timeout, conflict, too early, rate limited, and any server-side failure
# (Anthropic's 529 "overloaded" included).
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
STATUS_PAGES = {"openai": "https://status.openai.com", "anthropic": "https://status.anthropic.com"}
# Used when a server needs no key (a local llama.cpp, vLLM or Ollama): the SDK insists on one.
NO_KEY = "unused"


def api_key(env_var: str, *, required: bool = True) -> str:
    """The key from the environment, or a start-up error naming the variable."""
    value = os.environ.get(env_var, "").strip()
    if not value and required:
        raise ConfigurationError(f"model key missing: set {env_var} in the worker's environment")
    return value or NO_KEY


def translate(exc: Exception, provider: str, model: str) -> ModelError:
    """An SDK exception as a ``ModelError`` that says whether another try could help."""
    status = getattr(exc, "status_code", None)
    where = f"{provider} {model}"
    if isinstance(status, int):
        detail = _error_message(exc)
        if status in (401, 403):
            return ModelAuthError(f"{where}: {status} {detail}")
        if status in RETRYABLE_STATUS or status >= 500:
            page = STATUS_PAGES.get(provider)
            told = f"; see {page} for the provider's status" if page else ""
            return ModelUnavailable(f"{where}: {status} {detail}{told}", retry_after_s=_retry_after(exc))
        if status == 400 and "context" in detail.lower() and ("length" in detail.lower() or "window" in detail.lower()):
            return ModelError(f"{where}: the request is over the model's context window: {detail}")
        return ModelError(f"{where}: {status} {detail}")
    name = type(exc).__name__
    if isinstance(exc, ValueError):  # the body ended mid-JSON (a dropped connection, a proxy's cut)
        return ModelUnavailable(f"{where}: the response was cut off or is not JSON: {exc}")
    if name in ("APITimeoutError", "APIConnectionError") or isinstance(exc, (TimeoutError, ConnectionError)):
        return ModelUnavailable(f"{where}: {name}: {exc}")
    return ModelError(f"{where}: {name}: {exc}")


def _error_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
    return str(getattr(exc, "message", exc))[:500]


def _retry_after(exc: Exception) -> float | None:
    """Seconds the provider asked to wait (``retry-after-ms`` or ``retry-after`` in seconds)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for header, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(header)
        if raw:
            try:
                return max(0.0, float(raw) / scale)
            except ValueError:
                continue  # an HTTP date: backoff decides instead
    return None


# llama.cpp's server answers 500 with this when the model's output half-matches the tool-call format: at
# temperature 0 the same request fails the same way, so it is a turn to repair, not an outage to retry.
UNREADABLE_OUTPUT = "does not match the expected"
UNPARSED = "unparsed"  # the stop reason of such a turn (loop/decisions.py repairs it)


def failed_call(exc: Exception, provider: str, model: str, name: str) -> ModelTurn:
    """What a failed SDK call becomes: a turn to repair when the server could not read the model's output
    (llama.cpp's 500), else the ``ModelError`` ``translate`` sorts it into, raised."""
    if getattr(exc, "status_code", None) == 500 and UNREADABLE_OUTPUT in str(exc):
        return ModelTurn(text=_error_message(exc), model=name, stop_reason=UNPARSED)
    raise translate(exc, provider, model) from exc


def read_arguments(raw: object) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as an object, or empty with why they could not be read (told to the model)."""
    if raw is None or raw == "":
        return {}, None
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError as exc:
            return {}, f"arguments are not JSON ({exc.msg} at character {exc.pos}): {raw[:200]!r}"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__}: {str(raw)[:200]!r}"
    return value, None


def priced(model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int) -> Usage:
    return usage_of(model, input_tokens, output_tokens, cached_input_tokens, price_overrides())


class ClientPerProcess(Generic[C]):
    """An SDK client made on first use in each process: HTTP connection pools do not survive a fork, and a
    prefork worker imports the agent (and its model) before forking."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._client: C | None = None
        self._pid = 0

    def get(self) -> C:
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                self._client, self._pid = self._make(), os.getpid()
            return self._client


class ProviderModel(Generic[C]):
    """What an adapter over an official SDK holds: the provider's model id and the name the fleet shows,
    the key (read when the agent is declared), sampling options, the context window, and an SDK client
    per process that ``client(key)`` makes with the SDK's own retries off."""

    offline = False
    provider = ""
    key_env = ""  # read when no other variable is named, and then only if set (local servers need none)

    def __init__(self, model: str, *, base_url: str | None, api_key_env: str | None, temperature: float | None,
                 max_output_tokens: int | None, context_window: int, client: Callable[[str], C],
                 text_tool_calls: bool = False) -> None:
        self.model = model
        self.base_url = base_url
        self.name = model if base_url is None else f"{model}@{base_url}"
        key = api_key(api_key_env) if api_key_env else api_key(self.key_env, required=False)
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.context_window = context_window
        # Read tool calls the model wrote as text when the server returned none (``calls_in_text``): for
        # local servers whose parser misses a small model's calls. Off by default: a hosted API parses its own.
        self.text_tool_calls = text_tool_calls
        self._client = ClientPerProcess(lambda: client(key))

    def ready(self) -> None:
        """Build this process's SDK client now (the first one takes a few hundred milliseconds): a rate limiter
        calls it before it takes a permit, so the request that permit is for leaves at once."""
        self._client.get()

    def read_text_calls(self, turn: ModelTurn, offered: list[dict[str, Any]], iteration: int) -> ModelTurn:
        """``turn`` with the calls its text holds as its calls (``text_tool_calls``), ids ``i<iteration>t<n>``.
        A turn cut off at the output limit after whole calls is taken as those calls: the model ran on."""
        if not self.text_tool_calls or turn.tool_calls:
            return turn
        found = calls_in_text(turn.text, {str(t.get("name")) for t in offered})
        if not found:
            return turn
        calls = [ToolCall(id=f"i{iteration}t{n}", name=name, arguments=args) for n, (name, args) in enumerate(found)]
        return turn.model_copy(update={"tool_calls": calls, "text": None, "stop_reason": "tool_calls"})

    def failed(self, exc: Exception) -> ModelTurn:
        """The turn or ``ModelError`` a failed call becomes (``failed_call``)."""
        return failed_call(exc, self.provider, self.model, self.name)


_DECODER = json.JSONDecoder()
_CALL_NOISE = re.compile(r"\s*(?:```(?:json)?|</?tool_call>)?\s*")


def calls_in_text(text: str | None, offered: Collection[str]) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls a model wrote as text when its server did not parse them: JSON objects ``{"name": …,
    "arguments": {…}}`` at the start of the answer, one after another, bare, fenced (```json) or in Hermes
    ``<tool_call>`` tags. Small local models write calls so (measured: Qwen2.5-Coder-1.5B behind llama-server,
    whose parser then returns them as content). Every object must name a tool it was offered, or none are
    taken (prose that merely contains JSON stays prose); what follows the last call, an object that is no call
    among it, is the model running on."""
    if not text or not offered:
        return []
    calls: list[tuple[str, dict[str, Any]]] = []
    at = 0
    while True:
        at = _CALL_NOISE.match(text, at).end()  # type: ignore[union-attr]
        if at >= len(text) or text[at] != "{":
            break
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            break
        if calls and not (isinstance(value, dict) and "name" in value):
            break  # not a call at all (measured: a fenced copy of the answer's fields): the model running on
        if not (isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"] in offered
                and isinstance(value.get("arguments", {}), dict) and set(value) <= {"name", "arguments"}):
            return []
        calls.append((value["name"], value.get("arguments") or {}))
    return calls
