"""Retention (``agentfleet prune`` and the observers' retention timer): the indexes that let it find what is past
its keeping time, and delete it, at a cost that grows with what it deletes and not with the database.

* ``ix_runs_ended``: ended runs by when they last changed (a partial index, the twin of ``ix_runs_live``).
* ``ix_domain_events_run``, ``ix_run_artifacts_ref``: a run's domain events, and whether an artifact is still
  linked to any run, each without a scan of the table.
* ``ix_tool_health_events_at``, ``ix_processed_events_unowned``: health history, and dedupe marks that belong to
  no run, by age.

On a large database, create them first by hand with ``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` (as 0013 says),
then upgrade.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

ENDED = sa.text("state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')")
UNOWNED = sa.text("run_id IS NULL")


def upgrade() -> None:
    op.create_index("ix_runs_ended", "runs", ["updated_at", "run_id"], postgresql_where=ENDED, sqlite_where=ENDED,
                    if_not_exists=True)
    op.create_index("ix_domain_events_run", "domain_events", ["run_id"], if_not_exists=True)
    op.create_index("ix_run_artifacts_ref", "run_artifacts", ["ref"], if_not_exists=True)
    op.create_index("ix_tool_health_events_at", "tool_health_events", ["occurred_at"], if_not_exists=True)
    op.create_index("ix_processed_events_unowned", "processed_events", ["processed_at"], postgresql_where=UNOWNED,
                    sqlite_where=UNOWNED, if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_processed_events_unowned", "processed_events", if_exists=True)
    op.drop_index("ix_tool_health_events_at", "tool_health_events", if_exists=True)
    op.drop_index("ix_run_artifacts_ref", "run_artifacts", if_exists=True)
    op.drop_index("ix_domain_events_run", "domain_events", if_exists=True)
    op.drop_index("ix_runs_ended", "runs", if_exists=True)
