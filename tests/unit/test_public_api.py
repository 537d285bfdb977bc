import agentfleet

PINNED = [
    "Agent", "AgentfleetError", "ApprovalRule", "ErrorCode", "Goal", "GoalRejected", "HealthCheck", "Limits",
    "Message", "Model",
    "ModelError", "ModelRequest", "ModelTurn", "ReplayModel", "Result", "ResultStatus", "ScriptedModel", "Settings",
    "Tool", "ToolCall", "ToolContext", "ToolError", "ToolResult", "TransientToolError", "Usage", "__version__",
    "health_check", "tool",
]


def test_the_public_api_is_exactly_what_we_pinned() -> None:
    assert sorted(agentfleet.__all__) == sorted(PINNED)
    for name in PINNED:
        assert hasattr(agentfleet, name)


def test_every_error_is_an_agentfleet_error() -> None:
    for name in ("GoalRejected", "ModelError", "ToolError", "TransientToolError"):
        assert issubclass(getattr(agentfleet, name), agentfleet.AgentfleetError)
