"""Settings, only through environment variables ``AGENTFLEET_*`` (pydantic-settings).

Two profiles share all code: ``distributed`` (RabbitMQ, Postgres, Redis) and
``embedded`` (kombu's in-process memory transport and SQLite).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentfleet import constants
from agentfleet.models.pricing import ModelPrice, use_price_overrides
from agentfleet.models.ratelimit import ModelRateLimit
from agentfleet.models.retrying import RetryPolicy
from agentfleet.tools.health import TIER_TIMEOUTS_S
from agentfleet.tools.policy import ApprovalRule, rules_from_json

# Triggered runs: how many triggers deep one causal chain may go (an agent whose tool publishes the event that
# triggers it would otherwise start a run every second, forever), and how many runs one trace may hold in all.
TRIGGER_MAX_DEPTH = 8
TRACE_MAX_RUNS = 500
# Steps: how many times one step may be attempted before its message is poison.
MAX_STEP_ATTEMPTS = 3
# The inbox: limits on what one message may cost a worker (settings override them).
INBOX_MAX_BYTES = 1024 * 1024
MAX_DECOMPRESSED_BYTES = 4 * 1024 * 1024
STEP_RETRY_MAX_DELAY_S = 15.0
STEP_RETRY_WINDOW_S = 300.0
# Stuck runs: how long a live run may show no activity before the sweeper re-drives it.
STALL_AFTER_S = 120.0
SWEEP_INTERVAL_S = 15.0
RETENTION_INTERVAL_S = 3600.0
SCHEDULE_POLL_S = 1.0
# Tools.
DEFAULT_TOOL_TIMEOUT_S = 30.0
HEALTH_TTL_HEALTHY_S = 30.0
HEALTH_TTL_DOWN_S = 5.0
HEALTH_TICK_S = 0.25  # how often executors look for expired entries
GATE_VIEW_S = 1.0  # how long a planner reuses an all-healthy view of its tools
BREAKER_FAILURES = 5
BREAKER_WINDOW_S = 60.0
BREAKER_COOLDOWN_S = 30.0
TOOL_CACHE_TTL_S = 60.0
# Approvals: how often observers expire unanswered requests and apply answers whose event was lost
# (or that the CLI wrote beside an embedded fleet, which has no broker another process can reach).
APPROVAL_POLL_S = 1.0
# How long a starting worker or a CLI command keeps trying to reach the broker, the database and Redis
# before it exits non-zero naming the setting (a running worker rides out outages without limit).
CONNECT_TIMEOUT_S = 30.0
# Embedded mode: kombu's memory transport polls; 1 s default makes each hop slow.
EMBEDDED_POLLING_INTERVAL_S = 0.005
EMBEDDED_DATABASE_URL = "sqlite:///.agentfleet/agentfleet.db"
DEFAULT_WORKSPACE = ".agentfleet/workspace"  # what file tools may touch when AGENTFLEET_WORKSPACE is unset


Profile = Literal["embedded", "distributed"]


class Settings(BaseSettings):
    # An empty variable is an unset one: compose passes `${X:-}` for every optional setting it forwards.
    model_config = SettingsConfigDict(env_prefix="AGENTFLEET_", extra="ignore", frozen=True, env_ignore_empty=True)

    profile: Profile = "distributed"
    broker_url: str = "amqp://guest:guest@127.0.0.1:5672//"
    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: str = Field(default=constants.DEFAULT_NAMESPACE, pattern=r"^[A-Za-z0-9_.-]+$")
    # Comma-separated modules whose import registers agents (like Celery's ``include``).
    agents: str = ("agentfleet.examples.repo_report,agentfleet.examples.disk_usage,agentfleet.examples.refunds,"
                   "agentfleet.examples.polyglot,agentfleet.examples.support,agentfleet.examples.tidy")
    # Plugins (config/plugins.py): folders holding plugin folders (or one each), comma-separated; plugins switched
    # off by name; whether installed packages' entry points (group agentfleet.plugins) are read at all.
    plugin_paths: str = ""
    plugins_disabled: str = ""
    plugin_entry_points: bool = True
    # Root that file tools may touch; paths outside it are refused. Not the current directory by default: that
    # is usually a project, with its .env and .git/config; a dedicated folder, made at start, unless one is named.
    workspace: Path = Field(default_factory=lambda: Path(DEFAULT_WORKSPACE))
    log_level: str = "INFO"
    log_json: bool = True
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    max_step_attempts: int = MAX_STEP_ATTEMPTS
    embedded_database_url: str = EMBEDDED_DATABASE_URL
    embedded_polling_interval_s: float = EMBEDDED_POLLING_INTERVAL_S
    # The inbox takes anything from anyone: these bound what one message may cost a worker.
    inbox_max_bytes: int = Field(default=INBOX_MAX_BYTES, ge=1024)
    max_decompressed_bytes: int = Field(default=MAX_DECOMPRESSED_BYTES, ge=1024)
    max_json_depth: int = Field(default=constants.MAX_JSON_DEPTH, ge=4, le=500)
    # Transient failures of a step (database or broker down, step held by another worker) are
    # retried through the broker with exponential backoff up to this delay, for this long in all.
    step_retry_max_delay_s: float = Field(default=STEP_RETRY_MAX_DELAY_S, gt=0)
    step_retry_window_s: float = Field(default=STEP_RETRY_WINDOW_S, gt=0)
    # The sweeper: a live run with no activity for stall_after_s and nothing in flight is re-driven.
    stall_after_s: float = Field(default=STALL_AFTER_S, gt=0)
    sweep_interval_s: float = Field(default=SWEEP_INTERVAL_S, ge=0)  # 0: no sweeper in this worker
    # Retention: ended runs are deleted, with their steps, transcript, audit rows, approvals and artifacts no run
    # still links, this many days after they ended (unset: kept for ever; an agent's retention_days overrides it).
    # Observers apply it every retention_interval_s (0: not in this worker), one pass fleet-wide at a time.
    # Live progress: every run announces its steps on <ns>.public (step.planned, tool.started, tool.finished,
    # run.waiting), not only those whose goal asked for it ("progress": true). A publish per step and hop.
    step_events: bool = False
    # Schedules: how often observers look for due ticks (0: this worker fires none). Any number may: each tick
    # fires once.
    schedule_poll_s: float = Field(default=SCHEDULE_POLL_S, ge=0)
    retention_days: float | None = Field(default=None, gt=0)
    retention_interval_s: float = Field(default=RETENTION_INTERVAL_S, ge=0)
    # Tool timeout tiers; a tool's own timeout_s overrides its tier, and a tool without either gets
    # tool_timeout_s.
    tier_model_s: float = Field(default=TIER_TIMEOUTS_S["model"], gt=0)
    tier_database_s: float = Field(default=TIER_TIMEOUTS_S["database"], gt=0)
    tier_http_s: float = Field(default=TIER_TIMEOUTS_S["http"], gt=0)
    tier_local_s: float = Field(default=TIER_TIMEOUTS_S["local"], gt=0)
    # Health cache: how long a check's answer counts; a check may set its own.
    health_ttl_healthy_s: float = Field(default=HEALTH_TTL_HEALTHY_S, gt=0)
    health_ttl_down_s: float = Field(default=HEALTH_TTL_DOWN_S, gt=0)
    health_tick_s: float = Field(default=HEALTH_TICK_S, ge=0)  # 0: this worker runs no checks
    # How long a planner reuses a view in which every tool is available (bad news is always re-read).
    gate_view_s: float = Field(default=GATE_VIEW_S, ge=0)
    # Circuit breakers: this many failures that point at a tool within the window open it; after
    # the cool-down one call fleet-wide is let through to try it.
    breaker_failures: int = Field(default=BREAKER_FAILURES, ge=1)
    breaker_window_s: float = Field(default=BREAKER_WINDOW_S, gt=0)
    breaker_cooldown_s: float = Field(default=BREAKER_COOLDOWN_S, gt=0)
    # Trigger chains: a triggered run's generation is one more than the run whose event started it; past the depth,
    # or past the runs one trace may hold, a trigger starts nothing (dead-lettered TRIGGER_LOOP).
    trigger_max_depth: int = Field(default=TRIGGER_MAX_DEPTH, ge=1, le=1000)
    trace_max_runs: int = Field(default=TRACE_MAX_RUNS, ge=1)
    # Read-only tools' results are cached this long unless the tool says otherwise (0: not cached).
    tool_cache_ttl_s: float = Field(default=TOOL_CACHE_TTL_S, ge=0)
    # Approval rules for every agent: a JSON list of ApprovalRule objects (agentfleet.tools.policy).
    approval_rules: str = ""
    # How often observers expire unanswered approval requests and apply answers (0: not in this worker).
    approval_poll_s: float = Field(default=APPROVAL_POLL_S, ge=0)
    # Hooks (agentfleet.hooks): the audit trail (one row per run transition), Prometheus metrics served on
    # metrics_addr:metrics_port by each worker (unset: no metrics; 0: any free port), and the user's own
    # hooks as comma-separated module:attribute entries.
    audit: bool = True
    # Celery's task events (task-received, -started, -succeeded: what Flower lists) from every task, always. Off by
    # default, as in Celery: three extra messages a step, ~1 ms of worker CPU an iteration here. Flower switches
    # them on in the workers it watches (its enable_events, every few seconds, and `agentfleet flower` at start).
    task_events: bool = False
    audit_log: Path | None = None  # also append each committed transition here as a JSON line
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_addr: str = "127.0.0.1"
    hooks: str = ""
    # OpenTelemetry spans (one trace per run): "otlp" (OTEL_EXPORTER_OTLP_* say where) or "console"; empty: none.
    otel_exporter: str = ""
    # Values masked wherever they would leave the fleet (logs, public notifications, Flower, the CLI),
    # comma-separated; service URL passwords and secret-named environment variables are masked anyway.
    redact_values: str = ""
    # Model calls that fail for a passing reason (rate limit, overload, timeout) are tried this many times in
    # all, waiting up to this long between tries (or what the provider asks, capped by it).
    model_retry_attempts: int = Field(default=4, ge=1, le=20)
    model_retry_max_delay_s: float = Field(default=20.0, gt=0)
    # Prices (USD per million tokens) over the built-in table, by model: {"my-model": {"input": 1, "output": 2}}.
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict)
    # Model spec strings over the agents' own models, by agent name ("*": every agent), e.g.
    # {"triage": "openai:gpt-4.1-mini"}: the same agent on a cassette in tests and a real model in production.
    models: dict[str, str] = Field(default_factory=dict)
    # Fleet-wide rate limits by model name ("*": any model), shared through Redis (in-process when embedded):
    # {"gpt-4.1-mini": {"requests": "500/minute", "tokens": "200000/minute"}}.
    model_rate_limits: dict[str, ModelRateLimit] = Field(default_factory=dict)
    # The key that seals what the fleet writes to Redis and acts on when read back (health, breakers, cached
    # results, stop marks): a tool that reaches Redis cannot forge them. Unset: one is made once and kept in the
    # database (table fleet_secrets), shared by every process of the fleet.
    fleet_key: SecretStr | None = None
    # The console (`agentfleet console`): who may sign in, as comma-separated name:password pairs (none: the console
    # serves 127.0.0.1 only, to whoever reaches it, as Flower does), the key that signs its session cookies (unset:
    # a new one each start, which signs everyone out), and where it listens.
    console_credentials: SecretStr | None = None
    console_secret: SecretStr | None = None
    console_host: str = "127.0.0.1"
    console_port: int = Field(default=5580, ge=0, le=65535)
    # How long a worker at start, or a CLI command, tries to reach each service before it exits non-zero.
    connect_timeout_s: float = Field(default=CONNECT_TIMEOUT_S, ge=0)

    @field_validator("workspace")
    @classmethod
    def _absolute_workspace(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("approval_rules")
    @classmethod
    def _rules_parse(cls, value: str) -> str:
        rules_from_json(value)  # a bad rule stops the process at start-up, naming the fault
        return value

    @property
    def rules(self) -> tuple[ApprovalRule, ...]:
        return rules_from_json(self.approval_rules)

    @property
    def model_retry_policy(self) -> RetryPolicy:
        return RetryPolicy(attempts=self.model_retry_attempts, max_delay_s=self.model_retry_max_delay_s)

    @property
    def agent_modules(self) -> list[str]:
        return _listed(self.agents)

    @property
    def plugin_folders(self) -> list[str]:
        return _listed(self.plugin_paths)

    @property
    def disabled_plugins(self) -> list[str]:
        return _listed(self.plugins_disabled)

    def tier_timeout_s(self, tier: str) -> float:
        return float(getattr(self, f"tier_{tier}_s"))

    @property
    def embedded(self) -> bool:
        return self.profile == "embedded"

    @property
    def effective_broker_url(self) -> str:
        return "memory://" if self.embedded else self.broker_url

    @property
    def effective_database_url(self) -> str:
        return self.embedded_database_url if self.embedded else self.database_url

    def with_profile(self, profile: Profile) -> Settings:
        return self.model_copy(update={"profile": profile})


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


use_price_overrides(lambda: get_settings().model_prices)


def _listed(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
