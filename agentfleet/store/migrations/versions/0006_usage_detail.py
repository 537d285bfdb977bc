"""A run's cached input tokens, and whether any of its model calls had no price.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cached_input_tokens", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("unpriced", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("unpriced")
        batch.drop_column("cached_input_tokens")
