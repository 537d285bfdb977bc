"""``support``: three agents working together through domain events, never calling each other.

* ``triage`` reads a support ticket, decides its topic and priority with its tool, and that
  tool publishes ``domain.ticket.triaged`` (sent once the step commits).
* ``resolver`` is started by that event (a ``Trigger`` mapping the payload to its goal), hands
  two lookups to ``kb_search`` in one turn (they run in parallel as child runs, and the
  resolver holds no worker while it waits), and answers from what they found.
* ``kb_search`` searches a small knowledge base with its tool.

All three share the goal's trace: ``agentfleet trace RUN`` prints the whole tree. Each model
is a replay of a cassette (``*.cassette.json`` here: a tool-calling model's decisions, with
what it copied from its goal and tool results written as references), so the example runs
with no network and no key; the tools, events, triggers and delegation are real.
``AGENTFLEET_MODELS='{"*": "openai:gpt-4.1-mini"}'`` (or ``openai-compatible:…``) runs
them on a real model instead.

    agentfleet run triage --input '{"ticket_id": "T-100", "text": "I was charged twice for my invoice"}'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from agentfleet import Agent, Limits, Message, ReplayModel, ToolCall, ToolContext, Trigger, domain_event, tool

TICKET_TRIAGED = domain_event("ticket.triaged", {
    "type": "object",
    "required": ["ticket_id", "topic", "priority", "text"],
    "properties": {"ticket_id": {"type": "string"}, "topic": {"enum": ["billing", "login", "shipping", "other"]},
                   "priority": {"enum": ["low", "normal", "high"]}, "text": {"type": "string"}},
})

TOPICS = {"billing": ("charge", "charged", "invoice", "refund", "payment"),
          "login": ("password", "login", "log in", "2fa", "locked"),
          "shipping": ("parcel", "delivery", "shipping", "tracking")}
URGENT = ("twice", "urgent", "locked out", "asap", "immediately")

KNOWLEDGE = [
    {"id": "KB-1", "topic": "billing", "title": "Duplicate charges",
     "text": "Charged twice? A duplicate charge is refunded automatically within 5 days; support can refund "
             "at once."},
    {"id": "KB-2", "topic": "billing", "title": "Invoices", "text": "Invoices are under Settings → Billing."},
    {"id": "KB-3", "topic": "login", "title": "Reset a password", "text": "Use 'Forgot password' on the sign-in page."},
    {"id": "KB-4", "topic": "login", "title": "Locked accounts", "text": "Five failed sign-ins lock it 30 min."},
    {"id": "KB-5", "topic": "shipping", "title": "Tracking", "text": "Tracking links arrive by e-mail at dispatch."},
]


@tool(idempotent=True)
def triage_ticket(ctx: ToolContext, ticket_id: str, text: Annotated[str, Field(max_length=5000)]) -> dict[str, Any]:
    """Decide a ticket's topic and priority, and announce it (domain event ticket.triaged)."""
    lowered = text.lower()
    topic = next((t for t, words in TOPICS.items() if any(w in lowered for w in words)), "other")
    priority = "high" if any(w in lowered for w in URGENT) else "normal"
    ctx.publish(TICKET_TRIAGED, {"ticket_id": ticket_id, "topic": topic, "priority": priority, "text": text})
    return {"ticket_id": ticket_id, "topic": topic, "priority": priority}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _alike(asked: str, known: str) -> bool:
    """The same word, or one a suffix away ("charged", "charge"; "invoice", "invoices")."""
    return asked == known or (min(len(asked), len(known)) >= 4 and (asked.startswith(known)
                                                                    or known.startswith(asked)))


@tool(read_only=True)
def search_kb(query: Annotated[str, Field(min_length=1, max_length=500)], topic: str | None = None
              ) -> dict[str, Any]:
    """Search the knowledge base; articles of ``topic`` rank first."""
    asked = set(_words(query))
    scored = []
    for article in KNOWLEDGE:
        known = _words(f"{article['title']} {article['text']}")
        score = sum(1 for w in asked if any(_alike(w, k) for k in known)) + (2 if article["topic"] == topic else 0)
        if score:
            scored.append((score, article))
    scored.sort(key=lambda pair: (-pair[0], pair[1]["id"]))
    return {"hits": [{"id": a["id"], "title": a["title"], "text": a["text"]} for _, a in scored[:3]]}


ARTICLE = {"type": "object", "required": ["id", "title"],
           "properties": {"id": {"type": "string"}, "title": {"type": "string"}, "text": {"type": "string"}}}


def _cassette(agent: str) -> ReplayModel:
    return ReplayModel(Path(__file__).with_name(f"{agent}.cassette.json"))


# Worked exchanges each agent's model sees before its goal (word_stats's guide): small local models call tools, and
# finish with final_answer, reliably only after one (measured on Qwen2.5-Coder-1.5B: without them kb_search wrote
# its answer as a JSON block of made-up hits, three times).
def _said(call_id: str, name: str, arguments: dict[str, Any]) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, name=name, arguments=arguments)])


def _got(call_id: str, output: Any) -> Message:
    told = {"ok": True} if output is None else {"ok": True, "output": output}
    return Message(role="tool", tool_call_id=call_id, content=json.dumps(told, sort_keys=True))


def _goal(goal: dict[str, Any]) -> Message:
    return Message(role="user", content=json.dumps({"goal": goal}, sort_keys=True))  # as goals are worded


_PARCEL = {"ticket_id": "T-0", "text": "Where is my parcel? No tracking link yet"}
_TRACKING = [{"id": "KB-5", "text": KNOWLEDGE[4]["text"], "title": "Tracking"}]
TRIAGE_EXAMPLE = [
    _goal(_PARCEL),
    _said("ex1", "triage_ticket", _PARCEL),
    _got("ex1", {"ticket_id": "T-0", "topic": "shipping", "priority": "normal"}),
    _said("ex2", "final_answer", {"ticket_id": "T-0", "topic": "shipping", "priority": "normal"}),
    _got("ex2", None),
]
KB_SEARCH_EXAMPLE = [
    _goal({"query": "tracking link", "topic": "shipping"}),
    _said("ex1", "search_kb", {"query": "tracking link", "topic": "shipping"}),
    _got("ex1", {"hits": _TRACKING}),
    _said("ex2", "final_answer", {"hits": _TRACKING}),
    _got("ex2", None),
]
RESOLVER_EXAMPLE = [
    _goal({**_PARCEL, "topic": "shipping", "priority": "normal"}),
    Message(role="assistant", tool_calls=[
        ToolCall(id="ex1", name="delegate", arguments={"agent": "kb_search",
                                                       "input": {"query": "shipping", "topic": "shipping"}}),
        ToolCall(id="ex2", name="delegate", arguments={"agent": "kb_search",
                                                       "input": {"query": _PARCEL["text"], "topic": "shipping"}})]),
    _got("ex1", {"agent": "kb_search", "output": {"hits": _TRACKING}}),
    _got("ex2", {"agent": "kb_search", "output": {"hits": _TRACKING}}),
    _said("ex3", "final_answer", {"ticket_id": "T-0", "reply": _TRACKING[0]["text"], "sources": _TRACKING,
                                  "related": _TRACKING}),
    _got("ex3", None),
]


triage = Agent(
    "triage",
    instructions="Triage the support ticket with triage_ticket, then report its topic and priority.",
    model=_cassette("triage"),
    goal_schema={"type": "object", "required": ["ticket_id", "text"], "additionalProperties": False,
                 "properties": {"ticket_id": {"type": "string", "minLength": 1},
                                "text": {"type": "string", "minLength": 1, "maxLength": 5000}}},
    result_schema={"type": "object", "required": ["ticket_id", "topic", "priority"],
                   "properties": {"ticket_id": {"type": "string"}, "topic": {"type": "string"},
                                  "priority": {"type": "string"}}},
    tools=[triage_ticket],
    examples=TRIAGE_EXAMPLE,
    limits=Limits(max_steps=4),
)

resolver = Agent(
    "resolver",
    instructions="Answer the triaged ticket. Ask kb_search (delegate) for what the knowledge base says about its "
                 "topic and about its text, both at once. Reply from the best article found for the text; give "
                 "the articles found for the text as sources and those found for the topic as related.",
    model=_cassette("resolver"),
    goal_schema={"type": "object", "required": ["ticket_id", "topic", "text"],
                 "properties": {"ticket_id": {"type": "string"}, "topic": {"type": "string"},
                                "priority": {"type": "string"}, "text": {"type": "string"}}},
    result_schema={"type": "object", "required": ["ticket_id", "reply", "sources"],
                   "properties": {"ticket_id": {"type": "string"}, "reply": {"type": "string"},
                                  "sources": {"type": "array", "items": ARTICLE},
                                  "related": {"type": "array", "items": ARTICLE}}},
    delegates=["kb_search"],
    examples=RESOLVER_EXAMPLE,
    triggers=[Trigger(TICKET_TRIAGED, input={"ticket_id": "/ticket_id", "topic": "/topic", "priority": "/priority",
                                              "text": "/text"})],
    limits=Limits(max_steps=6, max_tokens=50_000),
)

kb_search = Agent(
    "kb_search",
    instructions="Search the knowledge base for the query with search_kb and return the hits.",
    model=_cassette("kb_search"),
    goal_schema={"type": "object", "required": ["query"],
                 "properties": {"query": {"type": "string", "minLength": 1}, "topic": {"type": "string"}}},
    result_schema={"type": "object", "required": ["hits"],
                   "properties": {"hits": {"type": "array", "items": ARTICLE}}},
    tools=[search_kb],
    examples=KB_SEARCH_EXAMPLE,
    limits=Limits(max_steps=3),
)
