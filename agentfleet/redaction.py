r"""Secrets masked wherever people or other systems see them: logs, public notifications, approval
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

A known secret value is also masked as the shapes it takes on the way out: JSON-escaped
(``\"``, ``\\``, ``\uXXXX`` for non-ASCII), and base64 (standard or URL-safe, at any of
the three alignments, so inside a larger encoded blob too). A value of 4 or 5 characters
(a short service password) is masked as a whole word only; shorter values are not masked
at all (they would mask ordinary words) — keep secrets longer than that.

What it cannot catch, and so is not promised: a secret split across lines, encrypted,
hashed, compressed, or transformed in any other way; a secret of fewer than 4 characters;
a secret no setting, variable name or pattern identifies.

What the fleet needs to work (the transcript the model reads, a tool's arguments) is
stored as it is; masking is for what leaves it: logs of every format, what the CLI prints
(``RedactingStream`` over its stdout and stderr), public messages, dead letters. Each
process installs its redactor once it knows its settings (``install``); until then the
patterns still apply.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

# Arguments masked wherever people or other systems see them (approval requests, the CLI).
# ("token" but not "tokens": input_tokens and max_tokens are counts, not credentials.)
SECRET_NAME = (r"(?i)(pass(word|wd|phrase)?|secret|token(?!s)|api[_-]?key|authori[sz]ation|credential"
                      r"|private[_-]?key|cookie)")
REDACTED = "***"


if TYPE_CHECKING:
    from agentfleet.config.settings import Settings

_SECRET = re.compile(SECRET_NAME)
MIN_SECRET_CHARS = 6  # a shorter value is masked as a whole word only (anywhere, it would mask ordinary words)
MIN_WORD_SECRET_CHARS = 4  # shorter still: not masked at all
MIN_ENCODED_CHARS = 8  # a base64 fragment shorter than this is too likely to occur by chance
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
        given = {v for v in values if v}
        self.values = tuple(sorted((v for v in given if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True))
        shapes = {shape for v in self.values for shape in _shapes(v)}
        self._needles = tuple(sorted(shapes, key=len, reverse=True))  # longest first: no half-masked secret
        self._values = re.compile("|".join(re.escape(v) for v in self._needles)) if shapes else None
        short = sorted({v for v in given if MIN_WORD_SECRET_CHARS <= len(v) < MIN_SECRET_CHARS}, key=len, reverse=True)
        self._short = tuple(short)
        self._words = (re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(v) for v in short) + r")(?![\w-])")
                       if short else None)

    @classmethod
    def from_settings(cls, settings: Settings, environ: dict[str, str] | None = None) -> Redactor:
        env = os.environ if environ is None else environ
        values = [v.strip() for v in settings.redact_values.split(",")]
        for url in (settings.broker_url, settings.database_url, settings.redis_url):
            try:
                parsed = make_url(url) if "://" in url else None
            except Exception:
                parsed = None
            password = str(parsed.password) if parsed is not None and parsed.password else None
            # A short password that is also its user name (guest:guest) is a public default, not a secret: masking
            # the word everywhere would hide the user in every line. The URL pattern still masks it in a URL.
            if password and not (len(password) < MIN_SECRET_CHARS and password == parsed.username):  # type: ignore[union-attr]
                values.append(password)
        values += [value for name, value in env.items() if _SECRET.search(name)]
        credentials = settings.console_credentials  # name:password pairs: each password is a secret of its own
        if credentials is not None:
            values += [pair.partition(":")[2] for pair in credentials.get_secret_value().split(",")]
        return cls(values)

    def text(self, value: str) -> str:
        # Plain substring tests first (a log line has a dozen fields, nearly all ids and names): a regex
        # alternation of the same needles costs several times more per field in CPython.
        for secret in self._needles:
            if secret in value:
                value = self._values.sub(REDACTED, value)  # type: ignore[union-attr]
                break
        for secret in self._short:
            if secret in value:
                value = self._words.sub(REDACTED, value)  # type: ignore[union-attr]
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


def _shapes(secret: str) -> set[str]:
    """The text a secret shows as once written out: itself, JSON-escaped (ASCII-only or not), and base64."""
    shapes = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    raw = secret.encode()
    for pad in range(3):  # where the secret starts within a 3-byte group of a larger blob
        encoded = base64.b64encode(b"\0" * pad + raw).decode().rstrip("=")
        start = -(-pad * 8 // 6)  # the first character made of the secret's bits alone
        end = (pad + len(raw)) * 8 // 6  # past the last such character
        for alphabet in (encoded, encoded.replace("+", "-").replace("/", "_")):
            fragment = alphabet[start:end]
            if len(fragment) >= MIN_ENCODED_CHARS:
                shapes.add(fragment)
    return shapes


class RedactingStream:
    """A text stream (stdout, stderr) whose every line passes the active redactor before it is written: what
    the CLI, a worker or a tool prints goes through the same masking as the logs. Lines are held until they end,
    so a secret written in two pieces is still one line when it is masked."""

    def __init__(self, stream: IO[str], redactor: Callable[[], Redactor] | None = None) -> None:
        self._stream = stream
        self._redactor = redactor or active
        self._held = ""

    def write(self, text: str) -> int:
        self._held += text
        if "\n" in self._held:
            done, _, self._held = self._held.rpartition("\n")
            self._stream.write(self._redactor().text(done + "\n"))
        return len(text)

    def flush(self) -> None:
        if self._held:
            self._stream.write(self._redactor().text(self._held))
            self._held = ""
        self._stream.flush()

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer: the stream's own
        return getattr(self._stream, name)


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


def unmasked(edited: Any, shown: Any, original: Any) -> Any:
    """Data a person edited from its masked view (``shown``), with the mask left where it was put back to the
    ``original`` value: a secret never travels out to be sent back, and is never replaced by the mask. Anything the
    person changed, or added, is theirs."""
    if edited == REDACTED and shown == REDACTED:
        return original
    if isinstance(edited, dict) and isinstance(shown, dict) and isinstance(original, dict):
        return {k: unmasked(v, shown.get(k), original.get(k)) if k in original else v for k, v in edited.items()}
    if (isinstance(edited, list) and isinstance(shown, list) and isinstance(original, list)
            and len(edited) == len(shown) == len(original)):
        return [unmasked(e, s, o) for e, s, o in zip(edited, shown, original, strict=True)]
    return edited


def redact(value: Any, schema: dict[str, Any] | None = None) -> Any:
    """``value`` as it may be shown or sent: see the module's note."""
    return _active.data(value, schema)
