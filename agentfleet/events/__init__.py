"""The envelope and catalogue, public contracts, topology and publisher."""

from agentfleet.events.contracts import Goal, GoalLimits, Result, ResultStatus, ResultUsage, parse_goal
from agentfleet.events.envelope import PAYLOADS, SCHEMA_VERSION, Envelope, EventType, decode
from agentfleet.events.publisher import Publisher
from agentfleet.events.topology import CONSUMERS, Topology, consumed_by

__all__ = [
    "CONSUMERS",
    "PAYLOADS",
    "SCHEMA_VERSION",
    "Envelope",
    "EventType",
    "Goal",
    "GoalLimits",
    "Publisher",
    "Result",
    "ResultStatus",
    "ResultUsage",
    "Topology",
    "consumed_by",
    "decode",
    "parse_goal",
]
