"""What model calls cost: a price table per model, in US dollars per million tokens.

Built-in prices are a starting point and go stale; ``AGENTFLEET_MODEL_PRICES`` (JSON, same shape)
overrides or adds entries. A model with no entry is *unpriced*: its calls count tokens and no dollars,
and the run says so rather than report $0. Pure: data in, data out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from agentfleet.loop.transcript import Usage


class ModelPrice(BaseModel):
    """US dollars per million tokens. Cached input (a prompt-cache hit) is billed at ``cached_input`` when
    given, else at ``input``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)


# Published list prices (USD per 1M tokens) when these models came out; they change: override in settings.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "gpt-4.1": ModelPrice(input=2.0, output=8.0, cached_input=0.5),
    "gpt-4.1-mini": ModelPrice(input=0.4, output=1.6, cached_input=0.1),
    "gpt-4.1-nano": ModelPrice(input=0.1, output=0.4, cached_input=0.025),
    "gpt-4o": ModelPrice(input=2.5, output=10.0, cached_input=1.25),
    "gpt-4o-mini": ModelPrice(input=0.15, output=0.6, cached_input=0.075),
    "claude-opus-4-1": ModelPrice(input=15.0, output=75.0, cached_input=1.5),
    "claude-opus-4-5": ModelPrice(input=5.0, output=25.0, cached_input=0.5),
    "claude-sonnet-4-5": ModelPrice(input=3.0, output=15.0, cached_input=0.3),
    "claude-haiku-4-5": ModelPrice(input=1.0, output=5.0, cached_input=0.1),
}


def price_for(model: str, overrides: Mapping[str, ModelPrice]) -> ModelPrice | None:
    """The model's price: an exact entry, else the longest entry the name starts with (dated snapshots
    such as ``gpt-4.1-mini-2025-04-14`` cost what their family does)."""
    table = {**DEFAULT_PRICES, **overrides}
    if model in table:
        return table[model]
    family = [name for name in table if model.startswith(name + "-")]
    return table[max(family, key=len)] if family else None


def usage_of(model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int,
             overrides: Mapping[str, ModelPrice]) -> Usage:
    """A call's usage with its cost, or marked unpriced. ``input_tokens`` includes the cached ones."""
    price = price_for(model, overrides)
    if price is None:
        return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cached_input_tokens=cached_input_tokens,
                     unpriced=True)
    cached = min(cached_input_tokens, input_tokens)
    cached_rate = price.input if price.cached_input is None else price.cached_input
    cost = ((input_tokens - cached) * price.input + cached * cached_rate + output_tokens * price.output) / 1e6
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cached_input_tokens=cached,
                 cost_usd=round(cost, 8))


_overrides: Callable[[], Mapping[str, ModelPrice]] = dict


def use_price_overrides(source: Callable[[], Mapping[str, ModelPrice]]) -> None:
    """Where adapters read the price table over the built-in one, when they price a call: the settings install
    theirs when they are imported (models sit below the settings, so the settings reach down, not the reverse)."""
    global _overrides
    _overrides = source


def price_overrides() -> Mapping[str, ModelPrice]:
    return _overrides()
