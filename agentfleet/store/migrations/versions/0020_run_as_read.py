"""A run held as a handling read it in an earlier transaction: the function that fails the transaction that finds it
changed (``store/runs.py`` ``HOLD_AS_READ``).

The planner reads its run before the model call and commits the turn in a second transaction. Instead of reading the
run again there (a round trip), that transaction checks the row with its COMMIT, in the same round trip; a row changed
since must fail the whole transaction, whose statements were all sent already. A statement can only fail it by
raising: this function raises, with its own SQLSTATE (``RUN_MOVED_ON``), which the store turns into ``RunMovedOn``.
Postgres only: SQLite reads the run again (a read there costs no round trip).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("""
        CREATE OR REPLACE FUNCTION agentfleet_moved_on(run_id text) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'run % is not as this handling read it', run_id USING ERRCODE = 'AF001';
        END $$
    """)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS agentfleet_moved_on(text)")
