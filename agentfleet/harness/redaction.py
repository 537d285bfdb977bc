"""Secrets masked wherever people or other systems see them: logs, public notifications, approval
requests, the CLI, Flower.

One place decides what a secret is:

* a value configured as one (``AGENTFLEET_REDACT_VALUES``), the passwords in the
  broker, database and Redis URLs, and the value of every environment variable whose
  name looks secret (``OPENAI_API_KEY``, ``DB_PASSWORD``, …), wherever it appears in
  a string;
* a common credential pattern: a password in a URL, a bearer token, a provider's API
  key shape (OpenAI, Anthropic, AWS, GitHub, Slack), ``password=…`` in a message;
* a value under a secret-looking name, at any depth, or one a tool's schema marks
  secret (``SecretStr`` gives ``writeOnly`` / ``format: password``).

What the fleet needs to work (the transcript the model reads, a tool's arguments) is
stored as it is; masking is for what leaves it. Each process installs its redactor
once it knows its settings (``install``); until then the patterns still apply.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from agentfleet.constants import REDACTED, SECRET_NAME

if TYPE_CHECKING:
    from agentfleet.config.settings import Settings

_SECRET = re.compile(SECRET_NAME)
MIN_SECRET_CHARS = 6  # a shorter configured value would mask ordinary words
_NAME = SECRET_NAME.removeprefix("(?i)")
_NAME_WORDS = ("pass", "secret", "token", "apikey", "api_key", "api-key", "authori", "credential", "private",
               "cookie")
# Each pattern with the lower-case text one of which it cannot match without: a pattern runs only on a
# string that holds one, so a log field of ids and names (nearly all of them) costs a few substring tests.
PATTERNS: tuple[tuple[tuple[str, ...], re.Pattern[str], str], ...] = (
    (("://",), re.compile(r"(://[^:/@\s]*:)([^@\s]+)(@)"), rf"\1{REDACTED}\3"),  # scheme://user:password@host
    (("bearer", "basic"), re.compile(r"\b((?i:bearer|basic))\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    (("sk-",), re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"), REDACTED),  # OpenAI and Anthropic keys
    (("akia", "asia"), re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),  # AWS access key ids
    (("gh", "github_pat_"), re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"), REDACTED),
    (("xox",), re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),  # Slack
    (_NAME_WORDS, re.compile(rf"((?i:{_NAME})[\"']?\s*[=:]\s*[\"']?)([^\s\"',;&}}]+)"), rf"\1{REDACTED}"),
)


class Redactor:
    """Masks configured secret values and credential patterns in strings, and secret-named values in data."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        kept = {v for v in values if v and len(v) >= MIN_SECRET_CHARS}
        self.values = tuple(sorted(kept, key=len, reverse=True))  # longest first: no half-masked secret
        self._values = re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None

    @classmethod
    def from_settings(cls, settings: Settings, environ: dict[str, str] | None = None) -> Redactor:
        env = os.environ if environ is None else environ
        values = [v.strip() for v in settings.redact_values.split(",")]
        for url in (settings.broker_url, settings.database_url, settings.redis_url):
            try:
                password = make_url(url).password if "://" in url else None
            except Exception:
                password = None
            if password:
                values.append(str(password))
        values += [value for name, value in env.items() if _SECRET.search(name)]
        return cls(values)

    def text(self, value: str) -> str:
        # Plain substring tests first (a log line has a dozen fields, nearly all ids and names): a regex
        # alternation of the same needles costs several times more per field in CPython.
        for secret in self.values:
            if secret in value:
                value = self._values.sub(REDACTED, value)  # type: ignore[union-attr]
                break
        lower = value.lower()
        for needles, pattern, replacement in PATTERNS:
            for needle in needles:
                if needle in lower:
                    value = pattern.sub(replacement, value)
                    break
        return value

    def data(self, value: Any, schema: dict[str, Any] | None = None) -> Any:
        """``value`` with every string masked and every secret-named (or schema-secret) entry replaced."""
        if isinstance(value, dict):
            properties = (schema or {}).get("properties") or {}
            marked = {name for name, spec in properties.items()
                      if isinstance(spec, dict) and (spec.get("writeOnly") or spec.get("format") == "password")}
            return {k: REDACTED if k in marked or (isinstance(k, str) and _SECRET.search(k)) else self.data(v)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value


_active = Redactor()


def install(redactor: Redactor) -> None:
    """This process's redactor (set once its settings are known: runtime, logging, CLI)."""
    global _active
    _active = redactor


def install_for(settings: Settings) -> Redactor:
    redactor = Redactor.from_settings(settings)
    install(redactor)
    return redactor


def active() -> Redactor:
    return _active


def redact(value: Any, schema: dict[str, Any] | None = None) -> Any:
    """``value`` as it may be shown or sent: see the module's note."""
    return _active.data(value, schema)
