"""Counting tokens before a call: a documented heuristic, scaled by what an exact counter said.

Exact counts need the model's own tokenizer. Where the model's server offers one (llama-server's ``/tokenize``;
``Model.count_tokens``), the planner counts the assembled prompt exactly and, when the heuristic ran short,
assembles again with the heuristic scaled by the measured ratio (``Heuristic.scaled``). Elsewhere the heuristic
alone decides, and it errs on the safe side: it was calibrated against llama-server's counts for
Qwen2.5-Coder-1.5B on the demo's prompts (figures in benchmarks/README.md, "Counting tokens"), and its rate is
set below the lowest characters-per-token measured there, so it counts more tokens than the model does.

The unit is a message's ``message_chars`` (its JSON, UTF-8 bytes: what ``History`` keeps summed as a run grows),
so a prompt that fits costs nothing per message of the transcript to size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentfleet.loop.transcript import Message, message_chars

# Calibrated (``python -m benchmarks.context_tokens``; benchmarks/README.md, "A context that always fits"): against
# Qwen2.5's tokenizer, 3.0 bytes of message JSON a token under-counted 11 of 17 prompts, by up to 28% (tool results
# of random letters, which hardly merge: ~2.2 bytes a token); at 2.0 none is under-counted. Prose and JSON are then
# over-counted ~1.5x: where the model's server counts exactly, the planner checks the assembled prompt with it.
CHARS_PER_TOKEN = 2.0
# What a chat template adds per message beyond its content (role markers, separators): 3-5 tokens measured.
TOKENS_PER_MESSAGE = 5.0
# The other way round, for what a model wrote (a turn is charged at least that, against a server that under-reports
# its output): a generous rate, so an honest model's own count is never raised.
WRITTEN_CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Heuristic:
    """``chars / chars_per_token + per_message`` a message, times ``scale`` (1 until an exact count says more)."""

    chars_per_token: float = CHARS_PER_TOKEN
    per_message: float = TOKENS_PER_MESSAGE
    scale: float = 1.0

    def chars(self, chars: int, count: int = 1) -> float:
        """Tokens of ``count`` messages whose ``message_chars`` add up to ``chars``."""
        return (chars / self.chars_per_token + self.per_message * count) * self.scale

    def message(self, message: Message) -> float:
        return self.chars(message_chars(message))

    def messages(self, messages: Sequence[Message]) -> float:
        return self.chars(sum(map(message_chars, messages)), len(messages))

    def tools(self, specs: Sequence[dict[str, Any]]) -> float:
        """Tool definitions, as a template renders them: their JSON, and a line each."""
        if not specs:
            return 0.0
        chars = specs.chars if isinstance(specs, ToolSpecs) else sum(map(spec_chars, specs))
        return self.chars(chars, len(specs))

    def scaled(self, estimated: float, exact: int) -> Heuristic:
        """This heuristic, scaled so that a prompt it estimated at ``estimated`` would count ``exact`` (and a
        little more: the next assembly differs from the one counted). Never scaled down below 1: an exact count
        that came in under the estimate leaves the estimate as it was, on the safe side."""
        if estimated <= 0 or exact <= estimated:
            return self
        return Heuristic(self.chars_per_token, self.per_message, self.scale * exact / estimated * 1.03)


def spec_chars(spec: Mapping[str, Any]) -> int:
    """A tool definition's size as the heuristic counts it: its JSON with sorted keys, in UTF-8 bytes."""
    return len(json.dumps(spec, sort_keys=True).encode())


class ToolSpecs(tuple[dict[str, Any], ...]):
    """Tool definitions as a model is offered them, with their size (``spec_chars``, summed) known from where each
    was declared: the counter sizes the definitions on every plan, and encoding each schema again was ~20-35 µs of a
    planner's handling (benchmarks/README.md, issue 23). A plain sequence of definitions is measured as it comes;
    ``chars`` not given (a copy, an unpickling) is measured here."""

    chars: int

    def __new__(cls, specs: Iterable[dict[str, Any]], chars: int | None = None) -> ToolSpecs:
        made = super().__new__(cls, specs)
        made.chars = sum(map(spec_chars, made)) if chars is None else chars
        return made


def whole(tokens: float) -> int:
    """A token figure as shown and compared: rounded up."""
    return int(-(-tokens // 1))
