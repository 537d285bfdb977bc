"""The run state machine, termination gates, budgets and decisions: pure, no I/O."""

from agentfleet.loop.budgets import Limits, Termination, check_gates
from agentfleet.loop.decisions import (
    Decision,
    Dispatch,
    Fail,
    Finish,
    Repair,
    decide,
    fan_in_complete,
    schema_errors,
)
from agentfleet.loop.keys import derived_event_id, idempotency_key, run_id_for
from agentfleet.loop.states import TERMINAL, TRANSITIONS, RunState, can_transition, is_terminal
from agentfleet.loop.transcript import Message, ModelTurn, ToolCall, ToolResult, Usage

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Decision",
    "Dispatch",
    "Fail",
    "Finish",
    "Limits",
    "Message",
    "ModelTurn",
    "Repair",
    "RunState",
    "Termination",
    "ToolCall",
    "ToolResult",
    "Usage",
    "can_transition",
    "check_gates",
    "decide",
    "derived_event_id",
    "fan_in_complete",
    "idempotency_key",
    "is_terminal",
    "run_id_for",
    "schema_errors",
]
