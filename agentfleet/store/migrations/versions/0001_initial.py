"""Runs, steps, transcript, observations, processed events and reply targets.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer, "sqlite")
Ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("goal_id", sa.String(200), nullable=False),
        sa.Column("trace_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("input", sa.JSON, nullable=False),
        sa.Column("limits", sa.JSON, nullable=False),
        sa.Column("steps_used", sa.Integer, nullable=False),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("cost_usd", sa.Float, nullable=False),
        sa.Column("result", sa.JSON),
        sa.Column("error_code", sa.String(64)),
        sa.Column("created_at", Ts, nullable=False),
        sa.Column("updated_at", Ts, nullable=False),
        sa.UniqueConstraint("agent", "goal_id", name="uq_runs_agent_goal"),
    )
    op.create_table(
        "steps",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("idempotency_key", sa.String(64), nullable=False, unique=True),
        sa.Column("run_id", sa.String(64), nullable=False, index=True),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("input", sa.JSON),
        sa.Column("output", sa.JSON),
        sa.Column("worker", sa.String(255)),
        sa.Column("started_at", Ts, nullable=False),
        sa.Column("finished_at", Ts),
        sa.Column("duration_ms", sa.Float),
    )
    op.create_table(
        "messages",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.UniqueConstraint("run_id", "iteration", "position", name="uq_messages_slot"),
    )
    op.create_table(
        "observations",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("result", sa.JSON, nullable=False),
        sa.Column("received_at", Ts, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "iteration", "call_id", name="pk_observations"),
    )
    op.create_table(
        "processed_events",
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("consumer", sa.String(32), nullable=False),
        sa.Column("outbox", sa.JSON, nullable=False),
        sa.Column("processed_at", Ts, nullable=False),
        sa.PrimaryKeyConstraint("event_id", "consumer", name="pk_processed_events"),
    )
    op.create_table(
        "run_replies",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False, index=True),
        sa.Column("reply_to", sa.String(255), nullable=False),
        sa.Column("correlation_id", sa.String(255), nullable=False),
        sa.Column("delivered_at", Ts),
        sa.UniqueConstraint("run_id", "reply_to", "correlation_id", name="uq_run_replies"),
    )


def downgrade() -> None:
    for table in ("run_replies", "processed_events", "observations", "messages", "steps", "runs"):
        op.drop_table(table)
