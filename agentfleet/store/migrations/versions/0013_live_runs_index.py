"""The sweeper's scan of quiet runs reads live runs through an index of them alone, so a million ended runs
cost it nothing (it sorted every run by its last change before).

Building it holds a write lock on ``runs`` for as long as it takes (seconds on millions of rows). Where that
matters, create it first by hand without the lock, then upgrade (this step then finds it and does nothing):
``CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_runs_live ON runs (updated_at, run_id)
WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

LIVE = sa.text("state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')")


def upgrade() -> None:
    op.create_index("ix_runs_live", "runs", ["updated_at", "run_id"], postgresql_where=LIVE, sqlite_where=LIVE,
                    if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_runs_live", "runs", if_exists=True)
