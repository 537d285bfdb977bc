"""The data a run's history is made of: messages, tool calls, model turns, usage.

Plain pydantic data shared by the loop, the context builder and model adapters.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter

from agentfleet.constants import REPAIR_MESSAGE_NAME


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Usage(BaseModel):
    """Tokens and dollars. ``input_tokens`` include ``cached_input_tokens`` (prompt-cache hits, billed
    lower); ``unpriced`` says some call's model had no price, so ``cost_usd`` counts only the priced ones."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cached_input_tokens: int = 0
    unpriced: bool = False

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 8),
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            unpriced=self.unpriced or other.unpriced,
        )


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


# A list of messages in one call to pydantic-core: the planner reads, sizes and sends the whole
# transcript every iteration, and per-message Python calls made that grow with the run.
MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """Values derived from objects nobody changes once made (messages: every layer makes a new one, never edits one),
    remembered for as long as the object lives and no longer (a weak reference; its death forgets the value). Sizing
    a long run's older messages again each plan made prompt assembly grow with the run (benchmarks/README.md)."""

    def __init__(self, make: Callable[[K], V]) -> None:
        self._make = make
        self._found: dict[int, tuple[weakref.ref[K], V]] = {}

    def __call__(self, obj: K) -> V:
        found = self.get(obj)
        if found is not None:
            return found
        value = self._make(obj)
        self.remember(obj, value)
        return value

    def get(self, obj: K) -> V | None:
        """What is remembered for ``obj``, or None."""
        hit = self._found.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else None

    def remember(self, obj: K, value: V) -> None:
        """Remember ``value`` for ``obj`` in place of what was."""
        key, found = id(obj), self._found
        found[key] = (weakref.ref(obj, lambda _, key=key: found.pop(key, None)), value)  # type: ignore[misc]


def _chars(message: Message) -> int:
    return len(_MESSAGE.dump_json(message, exclude_none=True))


# What one message adds to the JSON of a list of messages (its UTF-8 bytes, ``None`` fields left out): the unit the
# context builder sizes a prompt in (``context.builder.estimate_tokens``). Remembered per message.
message_chars: IdentityMemo[Message, int] = IdentityMemo(_chars)


def is_repair(message: Message) -> bool:
    """A note the planner told the model after an unusable turn (it counts against the run's repairs)."""
    return message.role == "user" and message.name == REPAIR_MESSAGE_NAME


@dataclass(frozen=True)
class History:
    """A run's transcript, with what the planner needs to know of all of it kept up to date as it grows.

    Sizing the whole transcript for the prompt budget, and counting its repair notes, cost a long run more each
    turn (0.9 ms a turn at iteration 1,000); kept here they cost what the new messages cost (``plus``).
    """

    messages: list[Message] = field(default_factory=list)
    chars: int = 0  # the messages' ``message_chars``, summed
    repairs: int = 0  # how many are repair notes
    # What the context assembly derived from these messages (``context.older.Index``: the older turns, weighed once
    # each), handed on by ``plus``: it was derived from a part of the longer history's messages too.
    derived: Derived = field(default_factory=lambda: Derived(), compare=False, repr=False)

    @classmethod
    def of(cls, messages: Iterable[Message]) -> History:
        return cls().plus(messages)

    def plus(self, more: Iterable[Message]) -> History:
        added = list(more)
        if not added:
            return self
        return History([*self.messages, *added], self.chars + sum(map(message_chars, added)),
                       self.repairs + sum(map(is_repair, added)), Derived(self.derived.value))


class Derived:
    """A value another room derives from a history's messages and keeps with them. Mutable, unlike the history: it
    is a memo, filled in when first needed; what it is derived from never changes (a history only grows by ``plus``,
    into a new one), and a reader checks it covers the messages it is given (``context.older.Index.covers``)."""

    __slots__ = ("value",)

    def __init__(self, value: object = None) -> None:
        self.value = value


class ModelTurn(BaseModel):
    """One answer of a model: text, tool calls, or both."""

    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str = "unknown"
    # Why the model stopped, in the OpenAI vocabulary ("stop", "tool_calls", "length", "content_filter");
    # adapters translate their provider's. "length" means the answer was cut off.
    stop_reason: str | None = None
    # Calls whose arguments the adapter could not read (not JSON, not an object), by call id, with why:
    # such a call is in ``tool_calls`` with empty arguments, so the model is answered by its id.
    malformed: dict[str, str] = Field(default_factory=dict)

    def as_message(self) -> Message:
        return Message(role="assistant", content=self.text, tool_calls=list(self.tool_calls))


class ToolResult(BaseModel):
    """What a tool call produced: an output, or a structured failure with a hint for the model."""

    ok: bool
    output: Any = None
    error_code: str | None = None
    message: str | None = None
    hint: str | None = None
    retryable: bool = False  # the same call may succeed later (the tool is down now, a lock is busy)
    duration_ms: float = 0.0
    cache_hit: bool = False  # served from the read-only result cache: the tool did not run
    # A person approved the call: who, their note, and the arguments it ran with if they edited them.
    approval: dict[str, Any] | None = None
    # Content the call left in the store (an output over its limit, a kept work directory): {ref, kind, size}.
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    # The artifacts' content (bytes, or a file the store streams in), from the harness to the executor, which
    # stores it with the step; never serialized.
    _payloads: dict[str, Any] = PrivateAttr(default_factory=dict)

    def payloads(self) -> dict[str, Any]:
        return self._payloads

    def carrying(self, payloads: dict[str, Any]) -> ToolResult:
        self._payloads = dict(payloads)
        return self

    @classmethod
    def failure(cls, code: str, message: str, hint: str | None = None, duration_ms: float = 0.0, *,
                retryable: bool = False) -> ToolResult:
        return cls(ok=False, error_code=code, message=message, hint=hint, duration_ms=duration_ms,
                   retryable=retryable)

    def for_model(self) -> dict[str, Any]:
        """What the model is told. An approved call says so: a person may have changed its arguments, and
        the model must not report what it asked for as what was done."""
        if self.ok:
            told_ok = {"ok": True, "output": self.output}
            return {**told_ok, "approval": self.approval} if self.approval else told_ok
        told = {"ok": False, "error_code": self.error_code, "message": self.message, "hint": self.hint}
        return {**told, "retryable": True} if self.retryable else told

    def for_model_json(self) -> str:
        return json.dumps(self.for_model(), default=str, sort_keys=True)
