"""Runs started by a delegation: their parent run, and the parent's call they answer.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("parent_run_id", sa.String(64)))
        batch.add_column(sa.Column("parent", sa.JSON))
        batch.create_index("ix_runs_parent", ["parent_run_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_parent")
        batch.drop_column("parent")
        batch.drop_column("parent_run_id")
