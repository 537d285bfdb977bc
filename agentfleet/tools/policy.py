"""Which tool calls wait for a person, and which are refused outright.

Decided in the executor, from the tool's declaration, the rules and the call's
arguments, before anything runs — never left to the prompt, which a model may
ignore or be talked out of. Pure: data in, a verdict out.

A rule names a tool (a name or a glob) and conditions on its arguments, all of
which must hold: ``match`` (a regular expression searched in an argument's text),
``above`` (a number greater than a threshold) and, in code only, ``when`` (a
function of the arguments). Deny rules are read first: a call one of them matches
is refused whatever else applies. A rule or a ``requires_approval`` function that
raises counts as asking: a policy that cannot be read fails closed.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from agentfleet.errors import ConfigurationError
from agentfleet.loop.pointers import MISSING, argument

Arguments = Mapping[str, Any]
RequiresApproval = bool | Callable[[dict[str, Any]], bool]


class ApprovalRule(BaseModel):
    """One rule over a tool's calls: ask a person (``ask``) or refuse (``deny``) when its conditions hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(default="*", min_length=1, description="Tool name, or a glob such as 'shell*'")
    action: Literal["ask", "deny"] = "ask"
    reason: str = Field(min_length=1, description="Shown to the person asked, or to the model when denied")
    match: dict[str, str] = Field(default_factory=dict,
                                  description="Argument (a name or a JSON Pointer) → regular expression searched "
                                              "in its text")
    above: dict[str, float] = Field(default_factory=dict,
                                    description="Argument (a name or a JSON Pointer) → the rule holds when the "
                                                "argument is a number greater than this")
    when: Callable[[dict[str, Any]], bool] | None = Field(default=None, exclude=True,
                                                          description="Code only: a further condition")
    expires_s: float | None = Field(default=None, gt=0, description="An unanswered request is denied after this")
    name: str | None = Field(default=None, min_length=1, description="How the rule is named in requests and logs")

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: dict[str, str]) -> dict[str, str]:
        for arg, pattern in value.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"match[{arg!r}]: {pattern!r} is not a regular expression: {exc}") from None
        return value

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        conditions = [f"{a}~/{p}/" for a, p in self.match.items()] + [f"{a}>{v:g}" for a, v in self.above.items()]
        if self.when is not None:
            conditions.append(getattr(self.when, "__name__", "when"))
        return f"{self.action} {self.tool}" + (f" if {' and '.join(conditions)}" if conditions else "")

    def covers(self, tool: str) -> bool:
        return fnmatch.fnmatchcase(tool, self.tool)

    def holds(self, arguments: Arguments) -> bool:
        """Whether every condition holds for these arguments (a missing argument holds none)."""
        for arg, pattern in self.match.items():
            value = argument(arguments, arg)
            if value is MISSING or re.search(pattern, value if isinstance(value, str)
                                              else json.dumps(value, default=str)) is None:
                return False
        for arg, threshold in self.above.items():
            value = argument(arguments, arg)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > threshold:
                return False
        return self.when is None or bool(self.when(dict(arguments)))


@dataclass(frozen=True)
class Verdict:
    """What happens to one call: it runs, waits for a person, or is refused."""

    action: Literal["allow", "ask", "deny"]
    rule: str | None = None
    reason: str | None = None
    expires_s: float | None = None


ALLOW = Verdict("allow")


def evaluate(tool: str, arguments: Arguments, *, requires_approval: RequiresApproval = False,
             expires_s: float | None = None, rules: Sequence[ApprovalRule] = ()) -> Verdict:
    """The verdict on one call of ``tool``: deny rules first, then the tool's own flag, then ask rules."""
    mine = [r for r in rules if r.covers(tool)]
    for rule in (r for r in mine if r.action == "deny"):
        try:
            if rule.holds(arguments):
                return Verdict("deny", rule.label, rule.reason)
        except Exception as exc:
            return _unreadable(rule.label, exc, rule.expires_s)
    if requires_approval:
        label = f"{tool}.requires_approval"
        try:
            asked = requires_approval(dict(arguments)) if callable(requires_approval) else True
        except Exception as exc:
            return _unreadable(label, exc, expires_s)
        if asked:
            return Verdict("ask", label, f"{tool} needs a person's approval", expires_s)
    for rule in (r for r in mine if r.action == "ask"):
        try:
            if rule.holds(arguments):
                return Verdict("ask", rule.label, rule.reason, rule.expires_s or expires_s)
        except Exception as exc:
            return _unreadable(rule.label, exc, rule.expires_s or expires_s)
    return ALLOW


def _unreadable(label: str, exc: Exception, expires_s: float | None) -> Verdict:
    return Verdict("ask", label, f"the rule could not be evaluated ({type(exc).__name__}: {exc}), so a person "
                                 "decides", expires_s)


_RULES = TypeAdapter(list[ApprovalRule])


@lru_cache(maxsize=8)
def rules_from_json(text: str) -> tuple[ApprovalRule, ...]:
    """Rules from settings (``AGENTFLEET_APPROVAL_RULES``, a JSON list), or ConfigurationError naming the fault."""
    if not text.strip():
        return ()
    try:
        return tuple(_RULES.validate_json(text))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = list(first["loc"])
        where = (f"rule {loc[0]}" + "".join(f".{p}" for p in loc[1:])) if loc else "a JSON list of rules is expected"
        raise ConfigurationError(f"AGENTFLEET_APPROVAL_RULES: {where}: {first['msg']}") from None


def check_rules(rules: Iterable[ApprovalRule], tools: Iterable[str], owner: str) -> tuple[ApprovalRule, ...]:
    """An agent's rules, each naming at least one of its tools (a rule that covers none is a typo)."""
    names = list(tools)
    out = tuple(rules)
    for rule in out:
        if not isinstance(rule, ApprovalRule):
            raise ConfigurationError(f"{owner}: approval_rules takes ApprovalRule objects, not {type(rule).__name__}")
        if not any(rule.covers(n) for n in names):
            raise ConfigurationError(f"{owner}: approval rule {rule.label!r} covers none of its tools "
                                     f"({', '.join(names) or 'none'})")
    return out
