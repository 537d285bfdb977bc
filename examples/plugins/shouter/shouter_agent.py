"""The shouter plugin: an agent built on the wordsmith plugin's ``shout`` tool (so it requires wordsmith)."""

from wordsmith_tools import shout

from agentfleet import Agent, ModelRequest, ModelTurn, ScriptedModel, ToolCall


def _shout(request: ModelRequest) -> ModelTurn:
    return ScriptedModel.calls(ToolCall(id="shout", name="shout", arguments={"text": request.goal["text"]}))


def _answer(request: ModelRequest) -> ModelTurn:
    told = request.tool_outputs()["shout"]
    return ScriptedModel.final({"text": told["output"]["text"] if told.get("ok") else told.get("message", "")})


shouter = Agent(
    "shouter",
    instructions="Repeat the goal's text in capitals, using the shout tool.",
    model=ScriptedModel([_shout, _answer], name="scripted:shouter"),
    goal_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    result_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    tools=[shout],
)
