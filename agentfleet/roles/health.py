"""Announcing a tool's health transition to the fleet as ``tool.health_changed``.

The fact itself lives in Redis; the event is its notification. It goes to the
observers (which store it and mirror it as plain JSON on ``<ns>.public``) with an
id derived from the transition, so a transition announced twice is one event.
A broker that is away loses the announcement, never the fact: it is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from agentfleet.events.envelope import FLEET_RUN_ID, Envelope, EventType, ToolHealthChanged
from agentfleet.events.publisher import Publisher
from agentfleet.fleet.gate import Transition
from agentfleet.loop.keys import derived_event_id

log = logging.getLogger(__name__)


def health_event(t: Transition) -> Envelope:
    payload = ToolHealthChanged(tool=t.tool, kind=t.kind, status=t.status, detail=t.detail,  # type: ignore[arg-type]
                                at=datetime.fromtimestamp(t.at, UTC), by=t.by)
    event_id = derived_event_id(FLEET_RUN_ID, EventType.TOOL_HEALTH_CHANGED, t.tool, t.kind, t.status, repr(t.at))
    return Envelope.new(EventType.TOOL_HEALTH_CHANGED, FLEET_RUN_ID, payload, trace_id=event_id, event_id=event_id)


def announcer(publisher: Publisher) -> Callable[[Transition], None]:
    def announce(t: Transition) -> None:
        try:
            publisher.publish([health_event(t)])
        except Exception:
            log.exception("could not announce that %s is %s", t.tool, t.status)

    return announce
