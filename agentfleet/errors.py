"""One exception root and one enum of error codes, documented once.

Error codes travel on the wire (Results, tool results, dead-letter headers);
exceptions stay inside a process. ``retryable`` says whether trying the same
thing again may succeed.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Every code a Result, a tool result or a dead letter may carry."""

    # Goals in.
    MALFORMED_MESSAGE = "MALFORMED_MESSAGE"  # body is not JSON, or not an object of the goal shape
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"  # body (or what it decompresses to) is over the inbox's size limit
    UNROUTABLE = "UNROUTABLE"  # the routing key matched no inbox binding
    GOAL_CONFLICT = "GOAL_CONFLICT"  # the goal_id names a run that was started with a different input
    EVENT_CONFLICT = "EVENT_CONFLICT"  # a domain event's id (its message_id) was recorded with another payload
    UNKNOWN_AGENT = "UNKNOWN_AGENT"  # the goal names no registered agent
    INPUT_INVALID = "INPUT_INVALID"  # the goal's input breaks the agent's goal schema
    # Runs out.
    OUTPUT_INVALID = "OUTPUT_INVALID"  # the agent's final answer breaks its result schema
    MAX_STEPS = "MAX_STEPS"
    TOKEN_BUDGET = "TOKEN_BUDGET"
    COST_BUDGET = "COST_BUDGET"
    DEADLINE = "DEADLINE"
    NO_PROGRESS = "NO_PROGRESS"
    CANCELLED = "CANCELLED"
    APPROVAL_DENIED = "APPROVAL_DENIED"  # a person denied a tool call (the model sees it as the call's result)
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"  # nobody answered an approval request before it expired
    MODEL_ERROR = "MODEL_ERROR"  # the model adapter failed or returned something unusable
    MODEL_AUTH = "MODEL_AUTH"  # the model provider refused the credentials
    CONTEXT_BUDGET_EXCEEDED = "CONTEXT_BUDGET_EXCEEDED"  # the never-compacted part of a prompt does not fit
    # Graphs (agentfleet/graphs/).
    NODE_FAILED = "NODE_FAILED"  # a graph's node failed and its policy ends the graph (or a condition raised)
    UNDECLARED_WRITE = "UNDECLARED_WRITE"  # a node wrote a state field it does not declare in writes=[...]
    UNDECLARED_READ = "UNDECLARED_READ"  # a node read a state field it does not declare in reads=[...]
    WRITE_CONFLICT = "WRITE_CONFLICT"  # two nodes of one step wrote a field that has no reducer
    STATE_INVALID = "STATE_INVALID"  # a step's writes break the graph's state model
    NO_ROUTE = "NO_ROUTE"  # no edge out of a finished node held
    GRAPH_CHANGED = "GRAPH_CHANGED"  # the run's record holds steps the graph, as loaded, would not take
    # Tools (structured results handed to the model).
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    TIMEOUT = "TIMEOUT"
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"
    RESPONSE_TOO_LARGE = "RESPONSE_TOO_LARGE"
    TRANSIENT = "TRANSIENT"
    INTERNAL = "INTERNAL"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"  # a subprocess tool ran past a sandbox limit (CPU time, file size)
    UNKNOWN_OUTCOME = "UNKNOWN_OUTCOME"  # a non-idempotent tool's earlier attempt died mid-call
    TRIGGER_LOOP = "TRIGGER_LOOP"  # a trigger would go past its chain's depth or its trace's run budget
    NOT_RUN = "NOT_RUN"  # a call of a turn told back to the model as unusable (another call in it was bad)
    TOO_MANY_CALLS = "TOO_MANY_CALLS"  # a model turn made more tool calls than limits.max_calls_per_turn
    # Approval answers (replies to approval.resolve, and the CLI's refusals).
    UNKNOWN_APPROVAL = "UNKNOWN_APPROVAL"  # no approval was requested for that run and call
    APPROVAL_NOT_PENDING = "APPROVAL_NOT_PENDING"  # already answered, expired, or its run has ended
    # Fleet.
    POISON_MESSAGE = "POISON_MESSAGE"  # a message crashed its worker too often
    MALFORMED_EVENT = "MALFORMED_EVENT"  # an internal message whose envelope does not validate
    SERVICE_UNREACHABLE = "SERVICE_UNREACHABLE"  # the broker, database or Redis did not answer (CLI, start-up)


RECOVERY_SUGGESTIONS: dict[ErrorCode, str] = {
    ErrorCode.MALFORMED_MESSAGE: "Publish a UTF-8 JSON object with 'agent' and 'input'; `agentfleet schema` "
                                 "prints the goal's JSON Schema.",
    ErrorCode.MESSAGE_TOO_LARGE: "Send a smaller goal (AGENTFLEET_INBOX_MAX_BYTES and "
                                 "AGENTFLEET_MAX_DECOMPRESSED_BYTES set the limits); pass large data by reference.",
    ErrorCode.UNROUTABLE: "Publish goals with routing key goal.<agent> (one word after 'goal.', lower case as "
                          "declared).",
    ErrorCode.GOAL_CONFLICT: "A goal_id is an idempotency key: use a new goal_id for a different input.",
    ErrorCode.EVENT_CONFLICT: "A domain event's message_id is its id: use a new message_id for a different "
                              "payload.",
    ErrorCode.UNKNOWN_AGENT: "Check the routing key goal.<agent> and that the workers load that agent.",
    ErrorCode.INPUT_INVALID: "Fix the goal input so it matches the agent's goal schema.",
    ErrorCode.OUTPUT_INVALID: "The agent's instructions or model must produce output matching its result schema.",
    ErrorCode.MAX_STEPS: "Raise limits.max_steps or give the agent a narrower goal.",
    ErrorCode.TOKEN_BUDGET: "Raise limits.max_tokens or shorten the context.",
    ErrorCode.COST_BUDGET: "Raise limits.max_cost_usd.",
    ErrorCode.CONTEXT_BUDGET_EXCEEDED: "The part named does not fit the model's context: shorten it (a smaller "
                                       "goal, fewer or shorter tools, a tool result under its response_limit) or "
                                       "give the agent a larger ContextBudget / a model with a larger window.",
    ErrorCode.DEADLINE: "Raise limits.deadline_s or split the goal.",
    ErrorCode.NODE_FAILED: "`agentfleet trace RUN` shows the node and its error; give it retries=, a fallback= or "
                           "on_failure=\"skip\" if the graph may go on without it.",
    ErrorCode.UNDECLARED_WRITE: "Add the field to the node's writes=[...] or stop writing it.",
    ErrorCode.UNDECLARED_READ: "Add the field to the node's reads=[...].",
    ErrorCode.WRITE_CONFLICT: "Give the field a reducer (Annotated[list[...], append] or another), or let one "
                              "node of the step write it.",
    ErrorCode.STATE_INVALID: "A node wrote a value the state's type refuses: fix the node or the state model.",
    ErrorCode.NO_ROUTE: "Add an edge out of the node for the case no condition held (for example to END).",
    ErrorCode.GRAPH_CHANGED: "The graph was changed while the run was under way: start the goal again, or fork "
                             "it with `agentfleet graph replay RUN --from NODE`.",
    ErrorCode.NO_PROGRESS: "The model repeated itself; refine its instructions or tools.",
    ErrorCode.TRIGGER_LOOP: "Agents trigger each other in a loop: break the cycle of events, or raise "
                            "AGENTFLEET_TRIGGER_MAX_DEPTH / AGENTFLEET_TRACE_MAX_RUNS if the chain is meant to be "
                            "long.",
    ErrorCode.TOO_MANY_CALLS: "The model kept making more tool calls in one turn than limits.max_calls_per_turn "
                              "allows; raise the limit or split the work.",
    ErrorCode.CANCELLED: "Submit the goal again with a new goal_id if it is still wanted.",
    ErrorCode.APPROVAL_DENIED: "A person denied the call; the model was told why and carried on.",
    ErrorCode.APPROVAL_EXPIRED: "Nobody answered in time: answer sooner (`agentfleet approvals`) or raise the "
                                "tool's or rule's expires_s.",
    ErrorCode.PERMISSION_DENIED: "A policy rule forbids this call; change the call, or the rule if it is wrong.",
    ErrorCode.UNKNOWN_APPROVAL: "List what waits with `agentfleet approvals`; use its run id and call id.",
    ErrorCode.APPROVAL_NOT_PENDING: "Only a pending request can be answered; `agentfleet status RUN` shows who "
                                    "answered it and when.",
    ErrorCode.MODEL_ERROR: "Check the model adapter's configuration and the provider's status; resubmit.",
    ErrorCode.MODEL_AUTH: "Check the model provider's API key in the worker's environment; resubmit.",
    ErrorCode.POISON_MESSAGE: "Inspect it with `agentfleet dlq show ID`, fix the worker, then `agentfleet dlq "
                              "replay ID`.",
    ErrorCode.SERVICE_UNREACHABLE: "Check the URL in the setting named, and that the service runs and accepts "
                                   "this host; AGENTFLEET_CONNECT_TIMEOUT_S sets how long to keep trying.",
    ErrorCode.INTERNAL: "A bug or outage in the fleet; the message is kept: `agentfleet dlq list`.",
}


class AgentfleetError(Exception):
    """Root of every error agentfleet raises."""

    code: ErrorCode = ErrorCode.INTERNAL
    retryable: bool = False

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ConfigurationError(AgentfleetError):
    """Settings, agent or tool declarations are wrong; fix and restart."""


class ServiceUnreachable(AgentfleetError):
    """The broker, the database or Redis did not answer within AGENTFLEET_CONNECT_TIMEOUT_S."""

    code = ErrorCode.SERVICE_UNREACHABLE


class GoalRejected(AgentfleetError):
    """A goal cannot become a run (malformed, unknown agent, invalid input), or another inbox message is not
    of its shape (an answer to an approval that is not JSON, too big, too deep)."""


class AgentNotLoaded(AgentfleetError):
    """This worker does not load the event's agent (workers disagree, as in a rolling deploy): another may."""

    code = ErrorCode.UNKNOWN_AGENT
    retryable = True


class MalformedEvent(AgentfleetError):
    """An internal message whose envelope does not validate."""

    code = ErrorCode.MALFORMED_EVENT


class ToolError(AgentfleetError):
    """Raised by tool code to return a specific structured failure to the model."""

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.INTERNAL, hint: str | None = None) -> None:
        super().__init__(message, code=code)
        self.hint = hint


class TransientToolError(ToolError):
    """A tool failure that may succeed if tried again (rate limit, flaky network)."""

    retryable = True

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, code=ErrorCode.TRANSIENT, hint=hint)


class ApprovalRefused(AgentfleetError):
    """An answer to an approval request that cannot be taken (unknown, already answered, bad edits)."""


class BadQuery(AgentfleetError):
    """An operator's filter or page cursor that cannot be read (typed by a person, or a link tampered with)."""


class ModelError(AgentfleetError):
    """The model adapter failed or returned something the loop cannot use; the same request would fail the
    same way (models/retrying.py does not try it again)."""

    code = ErrorCode.MODEL_ERROR
    retryable = False


class ModelUnavailable(ModelError):
    """Rate limited, overloaded, timed out or unreachable: another try may succeed, after ``retry_after_s``
    when the provider said how long."""

    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelAuthError(ModelError):
    """The provider refused the credentials: no retry helps until someone fixes the key."""

    code = ErrorCode.MODEL_AUTH
