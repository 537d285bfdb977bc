"""Artifacts: content a call produced that is too large for the model's context, kept once and read in parts.

Content-addressed (``sha256:<hex>``), so the same output stored by two calls is one
row, and a reference names exactly one content forever. The model sees the head of
an oversized output, its size and its reference, and reads on with the built-in
``read_artifact`` tool; a run reads only artifacts its own calls produced.
Pure: the store keeps them (``store.repository``), the executor links them to runs.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from pydantic import Field

from agentfleet import constants as C
from agentfleet.errors import ErrorCode, ToolError
from agentfleet.tools.tool import ToolContext, tool

ARTIFACT_HEAD_CHARS = 2000
ARTIFACT_READ_DEFAULT = 8000
ARTIFACT_READ_MAX = 16000


REF_PREFIX = "sha256:"


def content_ref(content: bytes) -> str:
    return REF_PREFIX + hashlib.sha256(content).hexdigest()


def artifact_view(tool_name: str, encoded: str, ref: str, limit: int) -> dict[str, Any]:
    """What the model is shown in place of an output over ``limit``: its head, its size, how to read on."""
    size = len(encoded.encode())
    head = encoded[: min(ARTIFACT_HEAD_CHARS, max(1, limit // 2))]
    return {
        "artifact": ref,
        "size": size,
        "head": head,
        "note": f"{tool_name} returned {size} bytes, over its limit of {limit}; the whole output is kept as "
                f"artifact {ref}. Read parts of it with read_artifact(ref, offset, length).",
    }


@tool(name=C.READ_ARTIFACT_TOOL, read_only=True, cache_ttl_s=0)
def read_artifact(ctx: ToolContext, ref: Annotated[str, Field(description="The artifact's reference (sha256:…)")],
                  offset: Annotated[int, Field(ge=0, description="First byte to read")] = 0,
                  length: Annotated[int, Field(ge=1, le=ARTIFACT_READ_MAX,
                                               description="How many bytes to read")] = ARTIFACT_READ_DEFAULT,
                  ) -> dict[str, Any]:
    """Read part of an artifact: an output that was too large to show whole, or files a tool kept.

    Returns the bytes from offset as text, the artifact's size, and next_offset (null at the end)."""
    found = ctx.artifact(ref, offset, length) if ctx.artifact is not None else None
    if found is None:
        raise ToolError(f"no artifact {ref!r} belongs to this run", code=ErrorCode.INVALID_ARGUMENTS,
                        hint="Use a reference a tool result of this run gave you.")
    part, size = found
    end = offset + len(part)
    return {"ref": ref, "size": size, "offset": offset, "text": part.decode(errors="replace"),
            "next_offset": end if end < size else None}
