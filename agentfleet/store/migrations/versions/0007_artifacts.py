"""Artifacts: content kept once by its sha256, and which runs' calls produced it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("ref", sa.String(80), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("media_type", sa.String(128), nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "run_artifacts",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("ref", sa.String(80), nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "ref", "call_id"),
    )


def downgrade() -> None:
    op.drop_table("run_artifacts")
    op.drop_table("artifacts")
