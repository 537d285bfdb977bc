"""The names and keys the fleet agrees on across rooms and processes: exchanges, queues, routing keys, headers,
Redis key kinds, built-in tool names, exit codes. Only what is truly shared (arq's ``constants.py``): a default
or a tunable lives at the top of the module that uses it (Dramatiq's way), a setting's default beside the setting.

Exchange and queue names are ``<namespace>.<suffix>``; the namespace defaults to
``agentfleet`` (the public contract) and exists so that tests and tenants can
share one broker without seeing each other's messages.
"""

from __future__ import annotations

from typing import Final

DEFAULT_NAMESPACE: Final = "agentfleet"

# Exchange suffixes.
INBOX: Final = "inbox"  # plain JSON goals in (topic, routing key goal.<agent>)
EVENTS: Final = "events"  # internal Celery task messages (topic, routing key = event type)
PUBLIC: Final = "public"  # plain JSON notifications out (topic)
DEAD: Final = "dead"  # dead letters (fanout)
AFFINITY: Final = "affinity"  # a run's next event to the process of its role that holds the run (headers; else events)
UNROUTABLE: Final = "inbox.unroutable"  # the inbox's alternate exchange and its queue (fanout)
# Celery's own: remote control (ping, inspect, pool_grow; kombu adds ".pidbox" and "reply.…") and
# task events (Flower), namespaced so one namespace's tools neither see nor touch another's workers.
CONTROL: Final = "control"
CELERY_EVENTS: Final = "celeryev"

# Queue suffixes (one per role, plus the inbox and dead-letter queues).
PLANNER: Final = "planner"
EXECUTOR: Final = "executor"
OBSERVER: Final = "observer"
ROLES: Final = (PLANNER, EXECUTOR, OBSERVER)

GOAL_ROUTING_PREFIX: Final = "goal."
APPROVAL_RESOLVE_ROUTING_KEY: Final = "approval.resolve"  # answers to approval requests, plain JSON
DOMAIN_ROUTING_PREFIX: Final = "domain."  # domain events, plain JSON: in on the inbox, mirrored on public

# The header an event carries to the process that holds its run (``<ns>.affinity`` matches on it): that process's token.
# Not ``x-``: RabbitMQ's headers exchange leaves those out of its match.
HEADER_AFFINITY: Final = "agentfleet-affinity"
# The header of an event's copy sent again from a stored outbox (a duplicate delivery's, the sweeper's): its first copy
# may have crashed a worker, so the receiver counts this one as redelivered (``workers.event_task.was_redelivered``).
HEADER_RESENT: Final = "agentfleet-resent"

# Message headers we add to dead letters.
HEADER_DEAD_REASON: Final = "x-agentfleet-reason"
HEADER_DEAD_ERROR_CODE: Final = "x-agentfleet-error-code"
HEADER_DEAD_SOURCE: Final = "x-agentfleet-source"
HEADER_DEAD_EXCHANGE: Final = "x-agentfleet-original-exchange"
HEADER_DEAD_ROUTING_KEY: Final = "x-agentfleet-original-routing-key"
HEADER_DEAD_AT: Final = "x-agentfleet-dead-at"
HEADER_PREFIX: Final = "x-agentfleet-"
# Headers the broker sets when it dead-letters; a client's own copies are not carried into ours.
BROKER_DEATH_HEADERS: Final = ("x-death", "x-first-death-", "x-last-death-")

# Input: how deep a JSON value from outside may nest (the inbox, a goal's input, settings).
MAX_JSON_DEPTH: Final = 64

# Delegation: the built-in tool an agent that declares ``delegates`` is offered.
DELEGATE_TOOL: Final = "delegate"
# Artifacts: an output over its tool's limit is kept and shown by its head; read_artifact reads on.
READ_ARTIFACT_TOOL: Final = "read_artifact"
# A tool result the context compacted is read back whole with read_artifact(ref="result:<call id>").
RESULT_REF_PREFIX: Final = "result:"
FINAL_ANSWER_TOOL: Final = "final_answer"
# The name on the user message of a repair turn: how the transcript counts the repairs a run has spent.
REPAIR_MESSAGE_NAME: Final = "agentfleet_repair"

# Fleet state in Redis (health cache, breakers, result cache, locks). Every key is
# ``<namespace>:<kind>:<name>``, built by ``redis_key`` from one of these kinds (arq's way).
FLEET_KEY_SECRET: Final = "redis-seal"  # the row of fleet_secrets holding the key that seals Redis values
HEALTH_KEY: Final = "health"  # a tool's cached check result, with a TTL; missing = unknown
HEALTH_LAST_KEY: Final = "health-last"  # the last status a check wrote (outlives the TTL, to see transitions)
HEALTH_CLAIM_KEY: Final = "health-claim"  # SET NX: the one executor re-checking an expired entry
BREAKER_KEY: Final = "breaker"  # a tool's breaker when not closed: {state, since, failures}
BREAKER_FAILURES_KEY: Final = "breaker-failures"  # sorted set of failure times (the rolling window)
BREAKER_TRIAL_KEY: Final = "breaker-trial"  # SET NX: the one call a half-open breaker lets through
CACHE_KEY: Final = "cache"  # a read-only tool's result under its canonical arguments
CACHE_HITS_KEY: Final = "cache-hits"  # hits per tool (for `agentfleet tools`)
LOCK_KEY: Final = "lock"  # a resource lock a tool declares (redis-py Lock)
RATE_LIMIT_KEY: Final = "ratelimit"  # prefix of a model's moving windows (the ``limits`` library's keys)
CANCEL_KEY: Final = "cancel"  # a cancelled run, so executors stop its running tools: {reason}
HEARTBEAT_KEY: Final = "heartbeat"  # a long tool call's last heartbeat: {at, details}

# Exit codes a supervisor or a script can act on (the CLI's 1 is a failed run, 3 a wait that ran out).
EXIT_CONFIGURATION: Final = 2  # a configuration to fix (as Click's usage errors)
EXIT_UNREACHABLE: Final = 69  # the broker, the database or Redis not reachable (sysexits' EX_UNAVAILABLE)


def exchange_name(namespace: str, suffix: str) -> str:
    return f"{namespace}.{suffix}"


def queue_name(namespace: str, suffix: str) -> str:
    return f"{namespace}.{suffix}"


# Dedicated tool queues (``@tool(queue="gpu")``): the calls of such a tool are published under
# ``tool.requested.<queue>`` to ``<ns>.executor.<queue>``, which only executors started with ``--queues <queue>``
# consume. ``default`` names the executor role's own queue in ``--queues``.
DEFAULT_TOOL_QUEUE: Final = "default"


def tool_queue_name(namespace: str, queue: str) -> str:
    return f"{namespace}.{EXECUTOR}.{queue}"


def tool_routing_key(queue: str) -> str:
    return f"tool.requested.{queue}"


def redis_key(namespace: str, kind: str, *parts: str) -> str:
    return ":".join((namespace, kind, *parts))
