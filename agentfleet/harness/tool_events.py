"""Domain events from a tool that runs outside the executor's process: the events file.

A subprocess tool (any language) appends one JSON object per line, ``{"name": ..., "payload":
{...}}``, to the file ``$AGENTFLEET_EVENTS`` names; a sandboxed Python tool's ``ctx.publish``
writes there for it. That "file" is a pipe the call inherits (``/proc/self/fd/N``), read by the
executor while the call runs, up to a bound (nothing a tool writes lands on the host's disk, and
there is no path to swap for a link). Once the process has exited, the executor publishes through
the call's ``ToolContext`` as an in-process tool would: after the step commits, with ids derived
from the step. All or nothing: one event that breaks its schema fails the call
(``INVALID_ARGUMENTS``, that event dead-lettered) and none is sent; a failed call sends none.
"""

from __future__ import annotations

import json
from typing import Any

from agentfleet.errors import ErrorCode, ToolError
from agentfleet.events.domain import problems
from agentfleet.loop.transcript import ToolResult
from agentfleet.tools.tool import ToolContext

TOOL_EVENTS_MAX = 100  # domain events one subprocess call may publish
TOOL_EVENTS_MAX_BYTES = 1024 * 1024


ENV = "AGENTFLEET_EVENTS"
Event = tuple[str, dict[str, Any]]


def read_events(raw: bytes, overflowed: bool, tool_name: str) -> list[Event] | ToolResult:
    """The events a call's process wrote (``raw``, at most ``TOOL_EVENTS_MAX_BYTES`` of them kept), or why they
    cannot be believed (a failure for the model)."""
    if overflowed or len(raw) > TOOL_EVENTS_MAX_BYTES:
        return ToolResult.failure(ErrorCode.RESPONSE_TOO_LARGE, f"{tool_name} wrote more than "
                                  f"{TOOL_EVENTS_MAX_BYTES} bytes of events", "Publish fewer, smaller events.")
    lines = [line for line in raw.decode(errors="replace").splitlines() if line.strip()]
    if len(lines) > TOOL_EVENTS_MAX:
        return ToolResult.failure(ErrorCode.RESPONSE_TOO_LARGE, f"{tool_name} wrote {len(lines)} events; at most "
                                  f"{TOOL_EVENTS_MAX} may come from one call", "Publish fewer, larger events.")
    events: list[Event] = []
    for number, line in enumerate(lines, 1):
        try:
            said = json.loads(line)
        except ValueError:
            said = None
        if not (isinstance(said, dict) and set(said) == {"name", "payload"} and isinstance(said["name"], str)):
            return _broken(tool_name, f"line {number} of its events is not "
                                      '{"name": "...", "payload": {...}}: ' + line[:200])
        events.append((said["name"], said["payload"]))
    return events


def publish_events(ctx: ToolContext, events: list[Event], *, succeeded: bool) -> ToolResult | None:
    """Hand the events to the call's context (sent once the step commits), or the failure of the first that
    breaks its schema. After a failed call none is sent, but one that breaks its schema is still refused
    (dead-lettered with the reason), as ``ctx.publish`` would have."""
    bad = [(name, payload) for name, payload in events if problems(name, payload)]
    for name, payload in bad[:1] if bad or not succeeded else events:
        try:
            ctx.publish(name, payload)
        except ToolError as exc:
            return ToolResult.failure(exc.code, exc.message, exc.hint)
    return None


def write_events(path: str, events: list[tuple[str, dict[str, Any]]]) -> None:
    """In the tool's process: append events where the executor will read them."""
    with open(path, "a", encoding="utf-8") as f:
        for name, payload in events:
            f.write(json.dumps({"name": name, "payload": payload}) + "\n")


def _broken(tool_name: str, what: str) -> ToolResult:
    return ToolResult.failure(ErrorCode.INTERNAL, f"{tool_name}: {what}",
                              "This is a bug in the tool; do not retry the same call unchanged.")
