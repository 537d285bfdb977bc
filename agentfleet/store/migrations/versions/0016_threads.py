"""Threads: goals that name a ``thread_id`` continue one conversation, one run at a time.

* ``runs.thread_id`` and ``runs.thread_seq`` (its place in the thread, given under the thread's lock: the order
  its runs take turns in), with an index of a thread's runs by place (what an earlier run left is read through
  it) and one of its live runs only (whose turn it is, whatever the number of ended runs).
* ``runs.started_at``: when a run that waited for its thread's turn got it; its deadline counts from there.
* ``threads``: one row per thread (how many runs it has had), which a run starting or ending on it locks, so two
  cannot both find it free.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# Runs of a thread only: the sweeper's scan of every live run must not find (and take) an index of some of them.
THREADED = sa.text("thread_id IS NOT NULL")
THREADED_LIVE = sa.text("thread_id IS NOT NULL AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("thread_id", sa.String(200)))
        batch.add_column(sa.Column("thread_seq", sa.Integer()))
        batch.add_column(sa.Column("started_at", sa.DateTime(timezone=True)))
    op.create_index("ix_runs_thread", "runs", ["thread_id", "thread_seq"], postgresql_where=THREADED,
                    sqlite_where=THREADED)
    op.create_index("ix_runs_thread_live", "runs", ["thread_id", "thread_seq"], postgresql_where=THREADED_LIVE,
                    sqlite_where=THREADED_LIVE)
    op.create_table(
        "threads",
        sa.Column("thread_id", sa.String(200), primary_key=True),
        sa.Column("runs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("threads")
    op.drop_index("ix_runs_thread_live", "runs")
    op.drop_index("ix_runs_thread", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("started_at")
        batch.drop_column("thread_seq")
        batch.drop_column("thread_id")
