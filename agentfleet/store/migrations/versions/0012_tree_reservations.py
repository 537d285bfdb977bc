"""What a delegated run's turns in flight have reserved in each ancestor: checked with what was spent, so
concurrent siblings cannot all pass one budget at once.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("reserved_tokens", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("reserved_cost_usd", sa.Float, nullable=False, server_default="0"))
        batch.add_column(sa.Column("reserved_steps", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("reserved_steps")
        batch.drop_column("reserved_cost_usd")
        batch.drop_column("reserved_tokens")
