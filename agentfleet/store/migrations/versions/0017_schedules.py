"""Schedules: goals fired on cron expressions or intervals, each tick once, by whichever scheduler gets there.

``next_at`` is the schedule's next tick; a scheduler takes a due schedule's row (``FOR UPDATE SKIP LOCKED``: two
never take one at once), publishes its goals and moves ``next_at`` on, in one transaction. A goal's id derives
from its tick, so a tick fired twice (a scheduler killed between the two) is one run.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

ACTIVE = sa.text("NOT paused")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("schedule_id", sa.String(100), primary_key=True),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("input", sa.JSON(), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("thread_id", sa.String(200)),
        sa.Column("cron", sa.String(200)),
        sa.Column("every_s", sa.Float()),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("jitter_s", sa.Float(), nullable=False),
        sa.Column("catch_up", sa.String(16), nullable=False),
        sa.Column("anchor", sa.DateTime(timezone=True), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fired", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("skipped", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_fired_at", sa.DateTime(timezone=True)),
        sa.Column("last_goal_id", sa.String(200)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_schedules_due", "schedules", ["next_at"], postgresql_where=ACTIVE, sqlite_where=ACTIVE)


def downgrade() -> None:
    op.drop_index("ix_schedules_due", "schedules")
    op.drop_table("schedules")
