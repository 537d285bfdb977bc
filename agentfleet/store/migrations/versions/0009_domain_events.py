"""Domain events as they were recorded (name, id, payload, cause), what started a triggered run, and runs by trace.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "domain_events",
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(64)),
        sa.Column("step_key", sa.String(64)),
        sa.Column("trace_id", sa.String(64), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_domain_events_name", "domain_events", ["name", "recorded_at"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cause", sa.JSON))
        batch.create_index("ix_runs_trace", ["trace_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_trace")
        batch.drop_column("cause")
    op.drop_index("ix_domain_events_name", "domain_events")
    op.drop_table("domain_events")
