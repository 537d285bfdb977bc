"""SQLAlchemy tables. Alembic migrations (``store/migrations``) create them; this is the code's view."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    false,
    text,
)

from agentfleet.loop.states import TERMINAL, RunState

metadata = MetaData()
Id = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements INTEGER only
Ts = DateTime(timezone=True)

# A run not yet ended, as a constant predicate (a partial index is used only for a predicate the planner can
# prove from the query's own text, not from bound parameters).
# In the order migration 0013 wrote it.
ENDED = (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)
LIVE_SQL = text("state NOT IN ({})".format(", ".join(f"'{state.value}'" for state in ENDED)))
THREADED_SQL = text("thread_id IS NOT NULL")  # a thread's indexes hold its runs only (migration 0016)
THREADED_LIVE_SQL = text("thread_id IS NOT NULL AND " + LIVE_SQL.text)
ENDED_SQL = text("state IN ({})".format(", ".join(f"'{state.value}'" for state in ENDED)))  # migration 0014
if set(ENDED) != TERMINAL:
    raise RuntimeError("tables.ENDED must name every terminal state (and migration 0013's index with it)")

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("agent", String(128), nullable=False),
    Column("goal_id", String(200), nullable=False),
    Column("trace_id", String(64), nullable=False),
    Column("state", String(32), nullable=False),
    Column("version", Integer, nullable=False, default=0),
    Column("iteration", Integer, nullable=False, default=0),
    Column("input", JSON, nullable=False),
    Column("limits", JSON, nullable=False),
    Column("steps_used", Integer, nullable=False, default=0),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("cached_input_tokens", Integer, nullable=False, default=0, server_default="0"),
    Column("unpriced", Boolean, nullable=False, default=False, server_default=false()),  # a call had no price
    # What descendants' turns in flight have reserved here (loop.budgets.Reservation), trued up as they record.
    Column("reserved_tokens", BigInteger, nullable=False, default=0, server_default="0"),
    Column("reserved_cost_usd", Float, nullable=False, default=0.0, server_default="0"),
    Column("reserved_steps", Integer, nullable=False, default=0, server_default="0"),
    Column("result", JSON),
    Column("error_code", String(64)),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    Column("redrives", Integer, nullable=False, default=0, server_default="0"),  # times the sweeper re-drove it
    Column("redriven_at", Ts),
    # A delegated run: the run whose call it answers, and that call (events.envelope.ParentCall).
    Column("parent_run_id", String(64)),
    Column("parent", JSON),
    Column("cause", JSON),  # a triggered run: the domain event that started it {event, event_id}
    Column("progress", Boolean, nullable=False, default=False, server_default=false()),  # announces its steps
    Column("thread_id", String(200)),  # a conversation it continues (what the thread's earlier runs left)
    Column("thread_seq", Integer),  # its place in the thread: the order the thread's runs take turns in
    Column("started_at", Ts),  # a run that waited for its thread's turn: when it got it (its deadline counts from it)
    # A run retried or forked from another: {"kind": "retry"|"fork", "run_id", "through"} (its transcript through that
    # iteration is this run's start, read from it by reference); lineage_run_id is that run, indexed.
    Column("lineage", JSON),
    Column("lineage_run_id", String(64)),
    UniqueConstraint("agent", "goal_id", name="uq_runs_agent_goal"),
    Index("ix_runs_parent", "parent_run_id"),
    Index("ix_runs_trace", "trace_id"),
    # Live runs only (migration 0013): what the sweeper scans, whatever the number of ended runs.
    Index("ix_runs_live", "updated_at", "run_id", postgresql_where=LIVE_SQL, sqlite_where=LIVE_SQL),
    # Ended runs only (migration 0014): what retention scans for runs past their keeping time.
    Index("ix_runs_ended", "updated_at", "run_id", postgresql_where=ENDED_SQL, sqlite_where=ENDED_SQL),
    # A thread's runs by age, and its live ones only (migration 0016): what it left, and whose turn it is.
    Index("ix_runs_thread", "thread_id", "thread_seq", postgresql_where=THREADED_SQL, sqlite_where=THREADED_SQL),
    Index("ix_runs_lineage", "lineage_run_id"),
    Index("ix_runs_thread_live", "thread_id", "thread_seq", postgresql_where=THREADED_LIVE_SQL,
          sqlite_where=THREADED_LIVE_SQL),
    # Pages of runs newest first, all or by agent or by state, and a goal id found (migration 0019: the console).
    Index("ix_runs_created", "created_at", "run_id"),
    Index("ix_runs_agent_created", "agent", "created_at", "run_id"),
    Index("ix_runs_state_created", "state", "created_at", "run_id"),
    Index("ix_runs_goal", "goal_id"),
)

# One row per thread: a run starting on it, or ending, locks it, so two runs never both find it free.
threads = Table(
    "threads",
    metadata,
    Column("thread_id", String(200), primary_key=True),
    Column("runs", Integer, nullable=False, default=0, server_default="0"),  # places given out (thread_seq)
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
)

# One row per step attempt-set: intent (status started) before side effects, outcome after.
steps = Table(
    "steps",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(64), nullable=False, unique=True),
    Column("run_id", String(64), nullable=False, index=True),
    Column("iteration", Integer, nullable=False),
    Column("kind", String(16), nullable=False),  # plan | tool
    Column("call_id", String(128), nullable=False, default=""),
    Column("name", String(128), nullable=False, default=""),
    Column("status", String(16), nullable=False),  # started | succeeded | failed
    Column("attempts", Integer, nullable=False, default=1),
    Column("input", JSON),
    Column("output", JSON),
    Column("worker", String(255)),
    Column("started_at", Ts, nullable=False),
    Column("finished_at", Ts),
    Column("duration_ms", Float),
)

# The transcript, append-only: storage grows with the conversation, never quadratically.
messages = Table(
    "messages",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("position", Integer, nullable=False),
    Column("body", JSON, nullable=False),
    UniqueConstraint("run_id", "iteration", "position", name="uq_messages_slot"),
)

# The observer's fan-in ledger: one row per tool result received.
observations = Table(
    "observations",
    metadata,
    Column("run_id", String(64), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("call_id", String(128), nullable=False),
    Column("tool", String(128), nullable=False),
    Column("result", JSON, nullable=False),
    Column("received_at", Ts, nullable=False),
    PrimaryKeyConstraint("run_id", "iteration", "call_id", name="pk_observations"),
)

# Dedupe on (event_id, consumer), with the events that handling produced (republished on redelivery).
processed_events = Table(
    "processed_events",
    metadata,
    Column("event_id", String(64), nullable=False),
    Column("consumer", String(32), nullable=False),
    Column("outbox", JSON, nullable=False),
    Column("processed_at", Ts, nullable=False),
    Column("run_id", String(64)),  # the run the event belongs to: the sweeper re-drives from here
    PrimaryKeyConstraint("event_id", "consumer", name="pk_processed_events"),
    Index("ix_processed_events_run", "run_id"),
    Index("ix_processed_events_unowned", "processed_at", postgresql_where=text("run_id IS NULL"),
          sqlite_where=text("run_id IS NULL")),
)

# Who asked for a run's Result (every copy of the goal with a reply_to).
run_replies = Table(
    "run_replies",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False, index=True),
    Column("reply_to", String(255), nullable=False),
    Column("correlation_id", String(255), nullable=False, default=""),
    Column("delivered_at", Ts),
    UniqueConstraint("run_id", "reply_to", "correlation_id", name="uq_run_replies"),
    # Results still owed only (migration 0013): what the sweeper asks for, whatever the number delivered.
    Index("ix_run_replies_owed", "run_id", postgresql_where=text("delivered_at IS NULL"),
          sqlite_where=text("delivered_at IS NULL")),
)

tool_health_events = Table(
    "tool_health_events",
    metadata,
    Column("event_id", String(64), primary_key=True),
    Column("tool", String(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("detail", String(1000)),
    Column("by", String(255), nullable=False),
    Column("occurred_at", Ts, nullable=False),
    Index("ix_tool_health_events_tool", "tool", "occurred_at"),
    Index("ix_tool_health_events_at", "occurred_at"),
)

# Tool calls parked for a person's answer. The id is the tool step's idempotency key: one request
# per call, however often its tool.requested is delivered.
approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", String(64), primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("call_id", String(128), nullable=False),
    Column("agent", String(128), nullable=False),
    Column("tool", String(128), nullable=False),
    Column("arguments", JSON, nullable=False),  # as the model sent them (run with them unless edited)
    Column("shown", JSON, nullable=False),  # the same, secrets masked: what people and the public exchange see
    Column("args_schema", JSON, nullable=False),  # edits are validated against it without loading the agent
    Column("request", JSON, nullable=False),  # the tool.requested payload, sent again once answered
    Column("rule", String(255), nullable=False),
    Column("reason", String(1000), nullable=False),
    Column("status", String(16), nullable=False),  # pending | approved | denied | expired
    Column("requested_at", Ts, nullable=False),
    Column("expires_at", Ts),
    Column("resolved_at", Ts),
    Column("resolved_by", String(255)),
    Column("note", String(2000)),  # the approver's note or the denial's reason
    Column("edited_arguments", JSON),
    Column("sent_at", Ts),  # approval.resolved was last published (null: not yet, the timer sends it)
    Column("applied_at", Ts),  # the observer has sent the call on (or found its run ended)
    Index("ix_approvals_run_call", "run_id", "call_id"),
    Index("ix_approvals_status", "status", "requested_at"),
)

# One row per run state transition (hooks/audit.py), in the transition's transaction: what moved the
# run (the event handled and by whom, or none for the sweeper and the CLI), why, and what it had cost.
audit = Table(
    "audit",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", Ts, nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("agent", String(128), nullable=False),
    Column("from_state", String(32), nullable=False),
    Column("to_state", String(32), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("event_id", String(64)),
    Column("event_type", String(64)),
    Column("reason", String(64)),  # the error code a run ended with
    Column("step_duration_ms", Float),  # from the step's start to this transition
    Column("input_tokens", Integer, nullable=False),  # the run's totals after the transition
    Column("output_tokens", Integer, nullable=False),
    Column("cost_usd", Float, nullable=False),
    Column("worker", String(255), nullable=False),
    Index("ix_audit_run", "run_id", "id"),
    Index("ix_audit_at", "at"),
)

# What people did to the fleet from the console or the CLI (ops/actions.py): who, by which way, what to which
# target, and what came of it. Written after the action is tried, whether it was accepted or refused.
operator_actions = Table(
    "operator_actions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", Ts, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("via", String(16), nullable=False),  # console | cli | client
    Column("action", String(32), nullable=False),  # approve | deny | cancel | replay | scale | purge
    Column("target", String(255), nullable=False),  # a run and call, a dead letter, a role
    Column("run_id", String(64)),
    Column("outcome", String(16), nullable=False),  # accepted | refused | failed
    Column("detail", JSON, nullable=False),  # masked: what was asked, and the answer
    Index("ix_operator_actions_at", "at"),
    Index("ix_operator_actions_run", "run_id", "id"),
)

# Artifacts (harness/artifacts.py): content kept once under its sha256 reference, and the calls that produced
# it; a run reads only artifacts linked to it.
artifacts = Table(
    "artifacts",
    metadata,
    Column("ref", String(80), primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("media_type", String(128), nullable=False),
    Column("content", LargeBinary),  # NULL: the content is in artifact_chunks (a file streamed in)
    Column("created_at", Ts, nullable=False),
)

# Content streamed in from a file (a kept work directory), ARTIFACT_CHUNK bytes a row: never held whole in memory.
artifact_chunks = Table(
    "artifact_chunks",
    metadata,
    Column("ref", String(80), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("ref", "seq"),
)

run_artifacts = Table(
    "run_artifacts",
    metadata,
    Column("run_id", String(64), nullable=False),
    Column("ref", String(80), nullable=False),
    Column("call_id", String(128), nullable=False),
    Column("tool", String(128), nullable=False),
    Column("kind", String(32), nullable=False),  # "output" (over the tool's limit) or "workdir" (kept files)
    Column("size", BigInteger, nullable=False),
    Column("created_at", Ts, nullable=False),
    PrimaryKeyConstraint("run_id", "ref", "call_id"),
    Index("ix_run_artifacts_ref", "ref"),  # is an artifact still linked to any run (retention)
)

# Domain events (events/domain.py) as recorded by the observer: what, from where (a run's step, or outside).
domain_events = Table(
    "domain_events",
    metadata,
    Column("event_id", String(64), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("source", String(16), nullable=False),  # run | external
    Column("run_id", String(64)),
    Column("step_key", String(64)),
    Column("trace_id", String(64), nullable=False),
    Column("recorded_at", Ts, nullable=False),
    Index("ix_domain_events_name", "name", "recorded_at"),
    Index("ix_domain_events_run", "run_id"),
)

# Secrets the fleet's processes share and nothing else reads: the key that seals what the fleet writes to Redis
# (agentfleet.fleet.fleet_redis), made once by whichever process needs it first.
fleet_secrets = Table(
    "fleet_secrets",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(128), nullable=False),
    Column("created_at", Ts, nullable=False),
)

# Schedules (roles/schedules.py): goals fired on cron expressions or intervals. A scheduler takes a due row, fires
# its ticks and moves next_at on, in one transaction; a tick's goal id derives from the tick (one run however often
# it is fired).
schedules = Table(
    "schedules",
    metadata,
    Column("schedule_id", String(100), primary_key=True),
    Column("agent", String(128), nullable=False),
    Column("input", JSON, nullable=False),
    Column("limits", JSON, nullable=False),
    Column("thread_id", String(200)),  # each firing continues this thread
    Column("cron", String(200)),
    Column("every_s", Float),
    Column("timezone", String(64), nullable=False),
    Column("jitter_s", Float, nullable=False),
    Column("catch_up", String(16), nullable=False),  # all | latest | none
    Column("anchor", Ts, nullable=False),  # an interval's ticks fall on anchor + k * every_s
    Column("paused", Boolean, nullable=False, default=False, server_default=false()),
    Column("next_at", Ts, nullable=False),
    Column("fired", Integer, nullable=False, default=0, server_default="0"),
    Column("skipped", Integer, nullable=False, default=0, server_default="0"),
    Column("last_fired_at", Ts),
    Column("last_goal_id", String(200)),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    Index("ix_schedules_due", "next_at", postgresql_where=text("NOT paused"), sqlite_where=text("NOT paused")),
)
