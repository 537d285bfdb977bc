"""Artifacts stored in chunks: a kept work directory (up to its tmpfs's size) is streamed into the store a chunk
at a time, never held whole in a worker's memory, and read back by the part asked for.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifact_chunks",
        sa.Column("ref", sa.String(80), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("ref", "seq"),
    )
    with op.batch_alter_table("artifacts") as batch:
        batch.alter_column("content", existing_type=sa.LargeBinary, nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.alter_column("content", existing_type=sa.LargeBinary, nullable=False)
    op.drop_table("artifact_chunks")
