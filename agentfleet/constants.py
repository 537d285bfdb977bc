"""Every name, key and timeout the fleet agrees on, in one place.

Exchange and queue names are ``<namespace>.<suffix>``; the namespace defaults to
``agentfleet`` (the public contract) and exists so that tests and tenants can
share one broker without seeing each other's messages.
"""

from __future__ import annotations

import uuid
from typing import Final

DEFAULT_NAMESPACE: Final = "agentfleet"

# Exchange suffixes.
INBOX: Final = "inbox"  # plain JSON goals in (topic, routing key goal.<agent>)
EVENTS: Final = "events"  # internal Celery task messages (topic, routing key = event type)
PUBLIC: Final = "public"  # plain JSON notifications out (topic)
DEAD: Final = "dead"  # dead letters (fanout)
UNROUTABLE: Final = "inbox.unroutable"  # the inbox's alternate exchange and its queue (fanout)

# Queue suffixes (one per role, plus the inbox and dead-letter queues).
PLANNER: Final = "planner"
EXECUTOR: Final = "executor"
OBSERVER: Final = "observer"
ROLES: Final = (PLANNER, EXECUTOR, OBSERVER)

GOAL_ROUTING_PREFIX: Final = "goal."

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

# Deterministic ids: run ids derive from (agent, goal_id), event ids from their cause.
ID_NAMESPACE: Final = uuid.UUID("5b2f3c1e-8d4a-4e7b-9a61-0c3f2d9e7a10")

# Loop defaults (an agent's or goal's limits override them).
DEFAULT_MAX_STEPS: Final = 20
DEFAULT_MAX_TOKENS: Final = 200_000
DEFAULT_MAX_COST_USD: Final = 5.0
DEFAULT_DEADLINE_S: Final = 600.0

# Steps: how many times one step may be attempted before its message is poison.
MAX_STEP_ATTEMPTS: Final = 3

# The inbox: limits on what one message may cost a worker (settings override them).
INBOX_MAX_BYTES: Final = 1024 * 1024
MAX_DECOMPRESSED_BYTES: Final = 4 * 1024 * 1024
MAX_JSON_DEPTH: Final = 64

# Transient step failures: broker-side retries with exponential backoff (full jitter).
STEP_RETRY_FIRST_DELAY_S: Final = 0.25
STEP_RETRY_MAX_DELAY_S: Final = 15.0
STEP_RETRY_WINDOW_S: Final = 300.0

# Stuck runs: how long a live run may show no activity before the sweeper re-drives it.
STALL_AFTER_S: Final = 120.0
SWEEP_INTERVAL_S: Final = 15.0
SWEEP_BATCH: Final = 200  # runs one sweep acts on at most
SWEEP_PAGE: Final = 500  # quiet runs read per query

# Tools.
DEFAULT_TOOL_TIMEOUT_S: Final = 30.0
DEFAULT_TOOL_RESPONSE_LIMIT: Final = 32_000  # characters of JSON handed back to the model
FINAL_ANSWER_TOOL: Final = "final_answer"

# Celery task time limits stay below RabbitMQ's consumer_timeout (30 min).
TASK_SOFT_TIME_LIMIT_S: Final = 15 * 60
TASK_TIME_LIMIT_S: Final = 20 * 60

# Embedded mode: kombu's memory transport polls; 1 s default makes each hop slow.
EMBEDDED_POLLING_INTERVAL_S: Final = 0.005
EMBEDDED_DATABASE_URL: Final = "sqlite:///.agentfleet/agentfleet.db"

# How often clients that follow a run poll its checkpoint.
FOLLOW_POLL_INTERVAL_S: Final = 0.05


def exchange_name(namespace: str, suffix: str) -> str:
    return f"{namespace}.{suffix}"


def queue_name(namespace: str, suffix: str) -> str:
    return f"{namespace}.{suffix}"
