"""Structured logs: JSON lines carrying run_id and trace_id, secrets redacted."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from agentfleet.redaction import active, redact

_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("agentfleet_log_context", default={})  # noqa: B039
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


@contextmanager
def log_context(**fields: str) -> Iterator[None]:
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(redact(entry), default=str)  # every field, the message and the traceback


class PlainFormatter(logging.Formatter):
    """Plain text lines (``AGENTFLEET_LOG_JSON=false``), masked like JSON lines: message, fields and traceback."""

    def format(self, record: logging.LogRecord) -> str:
        return active().text(super().format(record))


def configure(level: str | int = "INFO", as_json: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if as_json else PlainFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # The memory transport has no host; kombu warns about it on every connection.
    logging.getLogger("kombu.connection").setLevel(max(logging.ERROR, root.level))
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
