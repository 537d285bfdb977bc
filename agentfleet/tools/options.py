"""A tool's options, written once: every way of declaring a tool (``@tool``, ``subprocess_tool``, a
``.tool.toml`` manifest, a plugin, a built-in) takes these and no others, and they are checked here.

Like Dramatiq's actor options: one list refuses what it does not know, so an option misspelt in any
declaration path is a configuration error naming the known ones, never silently ignored.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from agentfleet.constants import DEFAULT_TOOL_QUEUE
from agentfleet.errors import ConfigurationError
from agentfleet.tools.health import TIERS, Tier
from agentfleet.tools.policy import RequiresApproval

DEFAULT_TOOL_RESPONSE_LIMIT = 32_000  # characters of JSON handed back to the model
TOOL_QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


LargeOutput = Literal["refuse", "artifact"]


class ToolOptions(BaseModel):
    """How the fleet treats a tool's calls. ``tier`` (``model``, ``database``, ``http``, ``local``) sets the timeout
    by what the tool calls; ``timeout_s`` overrides it. ``health_check`` (a function, a command line, or a shared
    check's name) decides fleet-wide whether the tool is offered; ``fallback`` names the agent's tool offered in its
    place while it is down. ``idempotent``: a call may run again with no harm (after a worker died mid-call, or
    beside a rare duplicate delivery), so it runs again where another tool's outcome would be UNKNOWN_OUTCOME, and
    its first attempt writes no intent before it runs when its timeout is short of the sweeper's patience.
    ``read_only`` tools are idempotent and their results are cached for ``cache_ttl_s``. ``lock`` is a resource held
    while a call runs, built from its arguments (``"ticket:{ticket_id}"``). ``requires_approval`` (True, or a
    function of the arguments returning whether to ask) parks each call until a person approves or denies it; an
    unanswered request is denied after ``approval_expires_s``. ``large_output="artifact"`` keeps a result over
    ``response_limit`` as an artifact and shows the model its head (``"refuse"``: RESPONSE_TOO_LARGE). ``queue``
    sends its calls to the executors that consume that queue only (``agentfleet worker executor --queues gpu``);
    while none does, the tool is not offered."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    timeout_s: float | None = None
    tier: Tier | None = None
    idempotent: bool = False
    read_only: bool = False
    cache_ttl_s: float | None = None  # read-only tools: how long a result is reused (None: the fleet default)
    health_check: Any = None
    fallback: str | None = None  # offered in this tool's place while it is down
    lock: str | None = None  # a resource lock template over the arguments, e.g. "ticket:{ticket_id}"
    response_limit: int = DEFAULT_TOOL_RESPONSE_LIMIT
    requires_approval: RequiresApproval = False  # True, or a function of the arguments
    approval_expires_s: float | None = None  # an unanswered request is denied after this (None: never)
    large_output: LargeOutput = "refuse"  # over response_limit: refused, or kept as an artifact the model can read
    queue: str | None = None  # its calls go to <ns>.executor.<queue>, for executors started with --queues <queue>

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(ToolOptions.model_fields)

    @classmethod
    def refuse_unknown(cls, where: str, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ConfigurationError(f"{where} got unknown option(s) {', '.join(unknown)}; known: "
                                     f"{', '.join(cls.names())}")

    @classmethod
    def of(cls, where: str, name: str, options: Mapping[str, Any]) -> ToolOptions:
        """``options`` as given to a declaration (``where``: ``@tool``, ``subprocess_tool``…): an option not in
        the list or a value of the wrong kind is a configuration error naming the tool and the fault. Options that
        contradict each other are ``check``'s, run once, by ``declare``, whichever way the options were made."""
        cls.refuse_unknown(where, options)
        tier = options.get("tier")
        if tier is not None and tier not in TIERS:
            raise ConfigurationError(f"tool {name!r}: tier must be one of {', '.join(TIERS)}")
        requires = options.get("requires_approval", False)
        if not isinstance(requires, bool) and not callable(requires):
            raise ConfigurationError(f"tool {name!r}: requires_approval is True/False or a function of the "
                                     "arguments")
        if options.get("large_output", "refuse") not in ("refuse", "artifact"):
            raise ConfigurationError(f"tool {name!r}: large_output is 'refuse' or 'artifact'")
        try:
            made = cls.model_validate(dict(options))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigurationError(f"tool {name!r}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        return made

    def check(self, name: str) -> None:
        for what, value in (("timeout_s", self.timeout_s), ("cache_ttl_s", self.cache_ttl_s)):
            if value is not None and value < 0:
                raise ConfigurationError(f"tool {name!r}: {what} cannot be negative")
        if self.approval_expires_s is not None and self.approval_expires_s <= 0:
            raise ConfigurationError(f"tool {name!r}: approval_expires_s must be positive")
        if self.requires_approval and self.read_only:
            raise ConfigurationError(f"tool {name!r}: a read_only tool's results are cached and reused; it "
                                     "cannot also require approval")
        if self.cache_ttl_s is not None and not self.read_only:
            raise ConfigurationError(f"tool {name!r}: cache_ttl_s is for read_only tools")
        if self.fallback == name:
            raise ConfigurationError(f"tool {name!r} cannot be its own fallback")
        if self.response_limit < 1:
            raise ConfigurationError(f"tool {name!r}: response_limit must be positive")
        if self.queue is not None and (not TOOL_QUEUE_NAME.fullmatch(self.queue) or self.queue == DEFAULT_TOOL_QUEUE):
            raise ConfigurationError(f"tool {name!r}: queue {self.queue!r} must be 1-40 lowercase letters, digits, "
                                     "'_' or '-', starting with a letter or digit, not 'default' (it becomes "
                                     "<ns>.executor.<queue>)")

    def check_lock(self, name: str, params: set[str]) -> None:
        """A lock names plain arguments only: no attribute or index access, nothing the model does not send."""
        if self.lock is None:
            return
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.lock) if f is not None]
        except ValueError as exc:
            raise ConfigurationError(f"tool {name!r}: lock template {self.lock!r}: {exc}") from None
        for f in fields:
            if not f.isidentifier() or f not in params:
                raise ConfigurationError(f"tool {name!r}: lock template {self.lock!r} names {f!r}, which is not "
                                         f"one of its arguments ({', '.join(sorted(params)) or 'none'})")
