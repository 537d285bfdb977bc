"""word_stats: how many words a text has, and its longest word (the README's guide to writing an agent)."""

import json
from pathlib import Path

from pydantic import BaseModel

from agentfleet import Agent, Limits, Message, ReplayModel, ToolCall, tool


@tool(read_only=True)
def count_words(text: str) -> dict:
    """Count the words in a text."""
    return {"words": len(text.split())}


@tool(read_only=True)
def longest_word(text: str) -> dict:
    """Find the longest word in a text (punctuation aside)."""
    words = [word.strip(".,;:!?\"'()") for word in text.split()]
    return {"word": max(words, key=len, default="")}


class Stats(BaseModel):
    words: int
    longest: str


SAMPLE = "Hello, big world"
# A worked exchange the model sees before the goal: small local models call tools reliably only after one.
EXAMPLE = [
    Message(role="user", content=json.dumps({"goal": {"text": SAMPLE}}, sort_keys=True)),  # as goals are worded
    Message(role="assistant", tool_calls=[ToolCall(id="ex1", name="count_words", arguments={"text": SAMPLE}),
                                          ToolCall(id="ex2", name="longest_word", arguments={"text": SAMPLE})]),
    Message(role="tool", tool_call_id="ex1", content='{"ok": true, "output": {"words": 3}}'),
    Message(role="tool", tool_call_id="ex2", content='{"ok": true, "output": {"word": "Hello"}}'),
    Message(role="assistant", tool_calls=[ToolCall(id="ex3", name="final_answer",
                                                   arguments={"words": 3, "longest": "Hello"})]),
    Message(role="tool", tool_call_id="ex3", content='{"ok": true}'),
]

word_stats = Agent(
    "word_stats",
    instructions="Report how many words the goal's text has and its longest word. Use the tools to find out.",
    model=ReplayModel(Path(__file__).with_name("word_stats.cassette.json")),
    goal_schema={"type": "object", "properties": {"text": {"type": "string", "maxLength": 10000}},
                 "required": ["text"]},
    result_schema=Stats,
    tools=[count_words, longest_word],
    examples=EXAMPLE,
    limits=Limits(max_steps=6, max_cost_usd=0.05),
)
