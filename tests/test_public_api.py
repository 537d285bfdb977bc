import agentfleet

PINNED = [
    "Agent", "AgentfleetError", "AnthropicModel", "OpenAIModel", "model_from_spec",
    "ApprovalRule", "ErrorCode", "Goal", "GoalRejected", "HealthCheck", "Limits",
    "Message", "Model", "ModelAuthError", "ModelError", "ModelRequest", "ModelTurn", "ModelUnavailable",
    "ReplayModel", "Result", "ResultStatus", "RetryPolicy", "RetryingModel", "ScriptedModel", "Settings",
    "Tool", "ToolCall", "ToolContext", "ToolError", "ToolResult", "TransientToolError", "Usage", "__version__",
    "health_check", "tool",
    # Tools in any language, sandboxed, and plugins (issue 12).
    "Plugin", "ResourceLimits", "Sandbox", "ToolCancelled", "load_tool_folder", "load_tool_manifest",
    "subprocess_tool",
    # Agents working together (issue 10).
    "Trigger", "domain_event",
    # A context that always fits (issue 24).
    "ContextBudget",
    # Graphs on the fleet (issue 25).
    "END", "Graph", "START", "append", "maximum", "merge", "minimum", "reducer", "register_graph",
    # Runs over time (issue 26).
    "Client",
]


def test_the_public_api_is_exactly_what_we_pinned() -> None:
    assert sorted(agentfleet.__all__) == sorted(PINNED)
    for name in PINNED:
        assert hasattr(agentfleet, name)


def test_every_error_is_an_agentfleet_error() -> None:
    for name in ("GoalRejected", "ModelAuthError", "ModelError", "ModelUnavailable", "ToolError",
                 "TransientToolError"):
        assert issubclass(getattr(agentfleet, name), agentfleet.AgentfleetError)
