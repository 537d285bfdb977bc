"""What the sweeper needs: each stored outbox knows its run; a run knows when it was last re-driven.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processed_events") as batch:
        batch.add_column(sa.Column("run_id", sa.String(64), nullable=True))
    op.create_index("ix_processed_events_run", "processed_events", ["run_id"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("redrives", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("redriven_at", sa.DateTime(timezone=True), nullable=True))
    # No index on runs.updated_at: it would make every transition of the hottest table maintain an
    # index (no HOT updates) to speed up one query a fleet runs every 15 s.


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("redriven_at")
        batch.drop_column("redrives")
    op.drop_index("ix_processed_events_run", "processed_events")
    with op.batch_alter_table("processed_events") as batch:
        batch.drop_column("run_id")
