"""Lineage: a run retried or forked from another starts from that run's transcript, read from it by reference.

``runs.lineage`` says from which run, how (``retry`` or ``fork``) and through which iteration; ``lineage_run_id``
(indexed) finds the runs that read another's transcript (retention keeps a run such a live run still reads).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lineage", sa.JSON()))
        batch.add_column(sa.Column("lineage_run_id", sa.String(64)))
    op.create_index("ix_runs_lineage", "runs", ["lineage_run_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_lineage", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lineage_run_id")
        batch.drop_column("lineage")
