"""The console: runs listed newest first by any filter without sorting the table, and what operators did.

Keyset pages of runs (``created_at, run_id`` descending) read an index in order whatever the filter: all runs,
one agent's, one state's; a goal id is found by its own index. ``operator_actions`` keeps each action a person
took from the console or the CLI (approve, deny, cancel, replay, scale), who took it and what came of it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_created", "runs", ["created_at", "run_id"])
    op.create_index("ix_runs_agent_created", "runs", ["agent", "created_at", "run_id"])
    op.create_index("ix_runs_state_created", "runs", ["state", "created_at", "run_id"])
    op.create_index("ix_runs_goal", "runs", ["goal_id"])
    op.create_table(
        "operator_actions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("via", sa.String(16), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("run_id", sa.String(64)),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_operator_actions_at", "operator_actions", ["at"])
    op.create_index("ix_operator_actions_run", "operator_actions", ["run_id", "id"])


def downgrade() -> None:
    op.drop_table("operator_actions")
    for name in ("ix_runs_goal", "ix_runs_state_created", "ix_runs_agent_created", "ix_runs_created"):
        op.drop_index(name, "runs")
