"""Reading a value out of arguments or a payload by name or JSON Pointer: rules and triggers decide on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MISSING: Any = object()  # what ``argument`` returns for a value that is not there


def argument(arguments: Mapping[str, Any], where: str) -> Any:
    """An argument by name, or deeper by JSON Pointer (``/card/number``); a sentinel when absent."""
    if not where.startswith("/"):
        return arguments.get(where, MISSING)
    value: Any = arguments
    for token in where[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, Mapping) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return MISSING
    return value
