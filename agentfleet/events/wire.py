"""Bytes from strangers: bounded decompression and strict JSON, before anything else looks at a message.

kombu decompresses a message's body as soon as it is received, whatever the size it
expands to. The decoders registered here stop at a limit instead, so a small body that
expands to gigabytes fails to decode (and is dead-lettered) rather than taking its
worker down; codecs that cannot be bounded are refused. The JSON reader refuses what
JSON itself does not allow (NaN, Infinity, numbers beyond a float) and what the rest of
the fleet could not store or serialise (deep nesting, NUL, lone surrogates).
"""

from __future__ import annotations

import bz2
import codecs
import json
import lzma
import math
import zlib
from collections.abc import Callable
from typing import Any

from kombu import compression

from agentfleet.errors import AgentfleetError, ErrorCode

_BOUNDED: dict[str, tuple[str, ...]] = {
    "application/x-gzip": ("gzip", "zlib"),
    "application/x-bz2": ("bzip2", "bzip"),
    "application/x-lzma": ("lzma", "xz"),
}
_state = {"limit": 0}


class MessageTooLarge(AgentfleetError):
    """A body, or what it decompresses to, is over its limit."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class WireError(AgentfleetError):
    """Bytes that are not the strict JSON the fleet accepts."""

    code = ErrorCode.MALFORMED_MESSAGE


def _bounded(make: Callable[[], Any], name: str) -> Callable[[bytes], bytes]:
    def decode(body: bytes) -> bytes:
        limit = _state["limit"]
        decompressor = make()
        try:
            out = decompressor.decompress(body, limit + 1)
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as exc:
            raise WireError(f"body does not decompress as {name}: {exc}") from None
        more = getattr(decompressor, "unconsumed_tail", b"") or not getattr(decompressor, "needs_input", True)
        if len(out) > limit or (more and not getattr(decompressor, "eof", False)):
            raise MessageTooLarge(f"body decompresses to more than {limit} bytes")
        return out

    return decode


def _refused(content_type: str) -> Callable[[bytes], bytes]:
    def decode(body: bytes) -> bytes:
        raise WireError(f"compression {content_type!r} is not accepted (zlib, gzip, bzip2 or lzma are)")

    return decode


def install_bounded_decompression(limit: int) -> None:
    """Make every kombu consumer in this process decompress at most ``limit`` bytes per message."""
    _state["limit"] = limit
    makers: dict[str, Callable[[], Any]] = {
        "application/x-gzip": lambda: zlib.decompressobj(wbits=47),  # zlib or gzip framing, detected
        "application/x-bz2": bz2.BZ2Decompressor,
        "application/x-lzma": lzma.LZMADecompressor,
    }
    for content_type in list(compression.encoders()):
        encoder, _ = compression.get_encoder(content_type)
        if content_type in makers:
            compression.register(encoder, _bounded(makers[content_type], content_type), content_type,
                                 aliases=list(_BOUNDED[content_type]))
        else:
            compression.register(encoder, _refused(content_type), content_type)


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]} is out of range")
    return value


def loads_strict(body: bytes | str, *, max_depth: int, encoding: str | None = None) -> Any:
    """JSON that every later step can store, validate and serialise, or WireError saying why not."""
    if isinstance(body, bytes) and encoding and encoding.lower().replace("_", "-") not in ("utf-8", "utf8", "binary"):
        try:
            codecs.lookup(encoding)
            body = body.decode(encoding)
        except (LookupError, UnicodeDecodeError, ValueError) as exc:
            raise WireError(f"body is not text in content_encoding {encoding[:40]!r}: {exc}") from None
    try:
        value = json.loads(body, parse_constant=_bad_constant, parse_float=_finite)
    except RecursionError:
        raise WireError(f"body is nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"body is not JSON: {str(exc)[:300]}") from None
    check_plain(value, max_depth=max_depth)
    return value


def check_plain(value: Any, *, max_depth: int) -> None:
    """Depth within limits, and every string (keys too) valid Unicode without NUL. Iterative: no recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise WireError(f"body is nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            _check_text(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise WireError("numbers must be finite")


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise WireError("strings may not contain NUL (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise WireError("strings must be valid Unicode (a lone surrogate escape was found)") from None
