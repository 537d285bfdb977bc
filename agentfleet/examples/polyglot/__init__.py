"""``polyglot``: tools in Python, Node.js and Bash, each a subprocess in the sandbox, counting one text.

Each tool is an executable beside a manifest (``tools/*.tool.toml``): arguments in as
JSON on stdin, the result out as JSON on stdout, run under bubblewrap with no network,
no view of the worker's files and rlimits. ``word_index`` answers more than its limit
for a long text, so its answer is kept as an artifact; the model sees the head and
reads on with the built-in ``read_artifact``. The model is scripted, so it runs with
no network and no key; the tools, the sandbox and the artifact store are real.

    agentfleet run polyglot --input '{"text": "the quick brown fox ..."}'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentfleet import Agent, Limits, ModelRequest, ModelTurn, ScriptedModel, ToolCall, load_tool_folder

TOOLS = load_tool_folder(Path(__file__).parent / "tools")
LANGUAGES = ("python", "node", "bash")


def _count(request: ModelRequest) -> ModelTurn:
    text = request.goal["text"]
    calls = [ToolCall(id=f"count-{lang}", name=f"word_count_{lang}", arguments={"text": text}) for lang in LANGUAGES]
    return ScriptedModel.calls(*calls, ToolCall(id="index", name="word_index", arguments={"text": text}))


def _read_on(request: ModelRequest) -> ModelTurn:
    index = request.tool_outputs()["index"]
    view = index.get("output") or {}
    if index.get("ok") and "artifact" in view:
        return ScriptedModel.calls(ToolCall(id="read", name="read_artifact",
                                            arguments={"ref": view["artifact"], "offset": 0, "length": 120}))
    return _answer(request)


def _answer(request: ModelRequest) -> ModelTurn:
    seen = request.tool_outputs()
    counts: dict[str, Any] = {}
    for lang in LANGUAGES:
        told = seen[f"count-{lang}"]
        counts[lang] = told["output"]["words"] if told.get("ok") else f"{told.get('error_code')}: {told.get('message')}"
    index = seen["index"].get("output") or {}
    read = seen.get("read", {}).get("output") or {}
    return ScriptedModel.final({
        "counts": counts,
        "agree": len({str(c) for c in counts.values()}) == 1,
        "index_artifact": index.get("artifact"),
        "index_size": index.get("size"),
        "index_start": read.get("text", json.dumps(index)[:120]),
    })


polyglot = Agent(
    "polyglot",
    instructions="Count the words of the text with every word counter offered; say whether they agree.",
    model=ScriptedModel([_count, _read_on, _answer], name="scripted:polyglot"),
    goal_schema={"type": "object", "properties": {"text": {"type": "string", "minLength": 1}},
                 "required": ["text"], "additionalProperties": False},
    result_schema={"type": "object", "required": ["counts", "agree"],
                   "properties": {"counts": {"type": "object"}, "agree": {"type": "boolean"},
                                  "index_artifact": {"type": ["string", "null"]},
                                  "index_size": {"type": ["integer", "null"]},
                                  "index_start": {"type": "string"}}},
    tools=TOOLS,
    limits=Limits(max_steps=8),
)
