"""The sweeper's scan of quiet runs reads live runs through an index of them alone, and Results still owed
through an index of undelivered replies alone, so a million ended runs (each with its Result delivered) cost it
nothing (it sorted every run by its last change before).

Building them holds a write lock on each table for as long as it takes (seconds on millions of rows). Where that
matters, create them first by hand without the lock, then upgrade (this step then finds them and does nothing):
``CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_runs_live ON runs (updated_at, run_id)
WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')`` and
``CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_run_replies_owed ON run_replies (run_id) WHERE delivered_at IS NULL``.

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
OWED = sa.text("delivered_at IS NULL")


def upgrade() -> None:
    op.create_index("ix_runs_live", "runs", ["updated_at", "run_id"], postgresql_where=LIVE, sqlite_where=LIVE,
                    if_not_exists=True)
    op.create_index("ix_run_replies_owed", "run_replies", ["run_id"], postgresql_where=OWED, sqlite_where=OWED,
                    if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_run_replies_owed", "run_replies", if_exists=True)
    op.drop_index("ix_runs_live", "runs", if_exists=True)
