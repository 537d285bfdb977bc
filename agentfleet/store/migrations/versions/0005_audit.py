"""The audit trail: one row per run state transition, written in the transition's transaction.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("from_state", sa.String(32), nullable=False),
        sa.Column("to_state", sa.String(32), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("event_id", sa.String(64)),
        sa.Column("event_type", sa.String(64)),
        sa.Column("reason", sa.String(64)),
        sa.Column("step_duration_ms", sa.Float),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("cost_usd", sa.Float, nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
    )
    op.create_index("ix_audit_run", "audit", ["run_id", "id"])
    op.create_index("ix_audit_at", "audit", ["at"])


def downgrade() -> None:
    op.drop_index("ix_audit_at", "audit")
    op.drop_index("ix_audit_run", "audit")
    op.drop_table("audit")
