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
# Turns a run may spend telling the model its answer could not be used (bad tool arguments, an undeclared
# tool, an empty, cut-off or off-schema answer) before it fails with that answer's code.
DEFAULT_MAX_REPAIRS: Final = 3
# Tool calls one model turn may make: a turn of 1,000 calls would be 1,000 side effects decided as one step.
DEFAULT_MAX_CALLS_PER_TURN: Final = 32
# Triggered runs: how many triggers deep one causal chain may go (an agent whose tool publishes the event that
# triggers it would otherwise start a run every second, forever), and how many runs one trace may hold in all.
TRIGGER_MAX_DEPTH: Final = 8
TRACE_MAX_RUNS: Final = 500
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
# Timeout tiers (seconds): what a tool or health check may take by the kind of thing it calls.
TIER_TIMEOUTS_S: Final = {"model": 30.0, "database": 5.0, "http": 3.0, "local": 1.0}
DEFAULT_TOOL_RESPONSE_LIMIT: Final = 32_000  # characters of JSON handed back to the model
# Delegation: the built-in tool an agent that declares ``delegates`` is offered.
DELEGATE_TOOL: Final = "delegate"
# Plugins: the entry point group installed packages declare, and the manifest a plugin folder holds.
PLUGIN_GROUP: Final = "agentfleet.plugins"
PLUGIN_MANIFEST: Final = "agentfleet-plugin.toml"
# Artifacts: an output over its tool's limit is kept and shown by its head; read_artifact reads on.
READ_ARTIFACT_TOOL: Final = "read_artifact"
ARTIFACT_HEAD_CHARS: Final = 2000
ARTIFACT_READ_DEFAULT: Final = 8000
ARTIFACT_READ_MAX: Final = 16000
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

HEALTH_TTL_HEALTHY_S: Final = 30.0
HEALTH_TTL_DOWN_S: Final = 5.0
HEALTH_TICK_S: Final = 0.25  # how often executors look for expired entries
GATE_VIEW_S: Final = 1.0  # how long a planner reuses an all-healthy view of its tools
BREAKER_FAILURES: Final = 5
BREAKER_WINDOW_S: Final = 60.0
BREAKER_COOLDOWN_S: Final = 30.0
TOOL_CACHE_TTL_S: Final = 60.0
CANCEL_TTL_S: Final = 24 * 3600.0  # a run's cancel mark outlives any tool call it could stop
HEARTBEAT_TTL_S: Final = 600.0

# Subprocess tools: the sandbox's default rlimits (a tool may set its own), how often a running
# call looks for its run's cancellation, how long a tool has after SIGTERM, and the most stdout
# read from one call (more is RESPONSE_TOO_LARGE without being kept).
SANDBOX_CPU_S: Final = 10
SANDBOX_MEMORY_MB: Final = 1024
SANDBOX_OPEN_FILES: Final = 256
SANDBOX_FILE_SIZE_MB: Final = 64
SANDBOX_PROCESSES: Final = 64
SANDBOX_TMP_MB: Final = 64
SANDBOX_WORKDIR_MB: Final = 256  # a call's work directory: a tmpfs in its sandbox
SANDBOX_UID_BASE: Final = 1_900_000_000  # calls of a root worker run as uids from here (one per running call)
SANDBOX_UID_POOL: Final = 4096
SANDBOX_FALLBACK_UID: Final = 65534
SANDBOX_CHECK: Final = "sandbox"  # the health check sandboxed tools share: can bubblewrap run here?
CANCEL_POLL_S: Final = 0.2
KILL_GRACE_S: Final = 0.5
SUBPROCESS_MAX_OUTPUT: Final = 32 * 1024 * 1024
STDERR_KEPT: Final = 4096
TOOL_EVENTS_MAX: Final = 100  # domain events one subprocess call may publish
TOOL_EVENTS_MAX_BYTES: Final = 1024 * 1024
REDIS_RETRY_S: Final = 1.0  # while Redis is unreachable, how long to skip it before trying again
REDIS_SOCKET_TIMEOUT_S: Final = 0.5

# Approvals: how often observers expire unanswered requests and apply answers whose event was lost
# (or that the CLI wrote beside an embedded fleet, which has no broker another process can reach).
APPROVAL_POLL_S: Final = 1.0
# How long a starting worker or a CLI command keeps trying to reach the broker, the database and Redis
# before it exits non-zero naming the setting (a running worker rides out outages without limit).
CONNECT_TIMEOUT_S: Final = 30.0
# Exit codes a supervisor or a script can act on (the CLI's 1 is a failed run, 3 a wait that ran out).
EXIT_CONFIGURATION: Final = 2  # a configuration to fix (as Click's usage errors)
EXIT_UNREACHABLE: Final = 69  # the broker, the database or Redis not reachable (sysexits' EX_UNAVAILABLE)
# An answer whose approval.resolved is not yet confirmed sent gets this long (its own publish is under
# way) before the timer sends it; one confirmed sent is sent again only after the stall time.
APPROVAL_SEND_GRACE_S: Final = 2.0
# Arguments masked wherever people or other systems see them (approval requests, the CLI).
# ("token" but not "tokens": input_tokens and max_tokens are counts, not credentials.)
SECRET_NAME: Final = (r"(?i)(pass(word|wd|phrase)?|secret|token(?!s)|api[_-]?key|authori[sz]ation|credential"
                      r"|private[_-]?key|cookie)")
REDACTED: Final = "***"

# Celery task time limits stay below RabbitMQ's consumer_timeout (30 min).
TASK_SOFT_TIME_LIMIT_S: Final = 15 * 60
TASK_TIME_LIMIT_S: Final = 20 * 60

# Embedded mode: kombu's memory transport polls; 1 s default makes each hop slow.
EMBEDDED_POLLING_INTERVAL_S: Final = 0.005
EMBEDDED_DATABASE_URL: Final = "sqlite:///.agentfleet/agentfleet.db"
DEFAULT_WORKSPACE: Final = ".agentfleet/workspace"  # what file tools may touch when AGENTFLEET_WORKSPACE is unset

# How often clients that follow a run poll its checkpoint.
FOLLOW_POLL_INTERVAL_S: Final = 0.05


def exchange_name(namespace: str, suffix: str) -> str:
    return f"{namespace}.{suffix}"


def queue_name(namespace: str, suffix: str) -> str:
    return f"{namespace}.{suffix}"


def redis_key(namespace: str, kind: str, *parts: str) -> str:
    return ":".join((namespace, kind, *parts))
