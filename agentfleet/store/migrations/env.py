"""Alembic environment: the URL comes from the caller (``agentfleet db upgrade``), never from a file."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from agentfleet.store.tables import metadata

config = context.config
url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")


def run_offline() -> None:
    context.configure(url=url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
