"""Tool arguments as people and other systems may see them: secrets masked.

Approval requests go to ``<ns>.public``, the CLI and the run's history, where a
password a model passed to a tool has no business. An argument is masked when its
schema says it is secret (``SecretStr`` gives ``writeOnly``/``format: password``) or
its name looks like one, at any depth.
"""

from __future__ import annotations

import re
from typing import Any

from agentfleet.constants import REDACTED, SECRET_NAME

_SECRET = re.compile(SECRET_NAME)


def redact(arguments: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    properties = (schema or {}).get("properties") or {}
    secret = {name for name, spec in properties.items()
              if isinstance(spec, dict) and (spec.get("writeOnly") or spec.get("format") == "password")}
    return {k: REDACTED if k in secret or _SECRET.search(k) else _mask(v) for k, v in arguments.items()}


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: REDACTED if isinstance(k, str) and _SECRET.search(k) else _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value
