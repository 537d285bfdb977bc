"""Tool calls waiting for a person's approval, and who answered.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "approvals",
        sa.Column("approval_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("arguments", sa.JSON, nullable=False),
        sa.Column("shown", sa.JSON, nullable=False),
        sa.Column("args_schema", sa.JSON, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("rule", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(1000), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requested_at", ts, nullable=False),
        sa.Column("expires_at", ts),
        sa.Column("resolved_at", ts),
        sa.Column("resolved_by", sa.String(255)),
        sa.Column("note", sa.String(2000)),
        sa.Column("edited_arguments", sa.JSON),
        sa.Column("sent_at", ts),
        sa.Column("applied_at", ts),
    )
    op.create_index("ix_approvals_run_call", "approvals", ["run_id", "call_id"])
    op.create_index("ix_approvals_status", "approvals", ["status", "requested_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_status", "approvals")
    op.drop_index("ix_approvals_run_call", "approvals")
    op.drop_table("approvals")
