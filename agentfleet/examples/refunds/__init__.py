"""``refunds``: refund an order — and a person approves any refund over $20 before money moves.

``issue_refund`` writes the refund to a ledger in the workspace (the side effect, once
per idempotency key). A rule on the agent parks every call over $20 until someone
answers; nothing is held while it waits, and the run survives restarts meanwhile::

    agentfleet run refunds --input '{"order_id": "A-1001", "amount_usd": 80}'

pauses and prints how to answer it from another terminal::

    agentfleet approve --embedded RUN CALL [--note ...] [--arguments '{"order_id": "A-1001", "amount_usd": 50,
                                                                       "reason": "partial"}']
    agentfleet deny --embedded RUN CALL --reason "needs a receipt"

Approved, the refund is made (with the edited arguments, if any); denied, the model is
told why and answers without refunding. The model is scripted, so the example runs
with no network and no API key; the rule, the wait and the ledger are real.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field

from agentfleet import Agent, ApprovalRule, Limits, ModelRequest, ModelTurn, ScriptedModel, ToolCall, ToolContext, tool

LEDGER = "refunds/ledger.jsonl"  # the payment system's stand-in, in the workspace (not hidden: tools may not)
Amount = Annotated[float, Field(gt=0, le=10_000, description="US dollars")]


@tool(tier="local")
def issue_refund(ctx: ToolContext, order_id: str, amount_usd: Amount, reason: str) -> dict:
    """Refund part or all of an order to the customer's original payment method."""
    ledger = ctx.resolve(LEDGER)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    if ledger.exists():  # the payment system's own dedupe, played by the ledger: one refund per key
        for line in ledger.read_text().splitlines():
            entry = json.loads(line)
            if entry["refund_id"] == ctx.idempotency_key[:16]:
                return entry
    entry = {"refund_id": ctx.idempotency_key[:16], "order_id": order_id, "amount_usd": amount_usd, "reason": reason}
    with ledger.open("a") as f:
        f.write(json.dumps(entry) + "\n")
    return entry


def _refund(request: ModelRequest) -> ModelTurn:
    goal = request.goal
    return ScriptedModel.calls(ToolCall(id="refund", name="issue_refund", arguments={
        "order_id": goal["order_id"], "amount_usd": goal["amount_usd"],
        "reason": goal.get("reason", "customer request")}))


def _answer(request: ModelRequest) -> ModelTurn:
    seen = request.tool_outputs()["refund"]
    if seen.get("ok"):
        done = seen["output"]
        return ScriptedModel.final({"order_id": done["order_id"], "refunded_usd": done["amount_usd"],
                                    "refund_id": done["refund_id"]})
    return ScriptedModel.final({"order_id": request.goal["order_id"], "refunded_usd": 0,
                                "note": f"not refunded: {seen.get('error_code')}: {seen.get('message')}"})


refunds = Agent(
    "refunds",
    instructions="Refund the order in the goal by the amount asked, then report what was refunded.",
    model=ScriptedModel([_refund, _answer], name="scripted:refunds"),
    goal_schema={"type": "object",
                 "properties": {"order_id": {"type": "string", "minLength": 1},
                                "amount_usd": {"type": "number", "exclusiveMinimum": 0, "maximum": 10_000},
                                "reason": {"type": "string"}},
                 "required": ["order_id", "amount_usd"], "additionalProperties": False},
    result_schema={"type": "object",
                   "properties": {"order_id": {"type": "string"}, "refunded_usd": {"type": "number"},
                                  "refund_id": {"type": "string"}, "note": {"type": "string"}},
                   "required": ["order_id", "refunded_usd"], "additionalProperties": False},
    tools=[issue_refund],
    approval_rules=[ApprovalRule(name="refund-over-20", tool="issue_refund", above={"amount_usd": 20},
                                 reason="refunds over $20 need a person's approval", expires_s=3600)],
    # The wait for a person counts against the deadline: give it room.
    limits=Limits(max_steps=4, max_tokens=20_000, max_cost_usd=0.1, deadline_s=7200),
)
