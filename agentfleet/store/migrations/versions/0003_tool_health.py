"""Every change of a tool's health or breaker, as the observer received it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tool_health_events",
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail", sa.String(1000)),
        sa.Column("by", sa.String(255), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_tool_health_events_tool", "tool_health_events", ["tool", "occurred_at"])


def downgrade() -> None:
    op.drop_index("ix_tool_health_events_tool", "tool_health_events")
    op.drop_table("tool_health_events")
