"""Engines and migrations: Postgres in distributed mode, SQLite in embedded mode."""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

MIGRATIONS = Path(__file__).with_name("migrations")
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _new_pools_in_child() -> None:
    """A forked child (the prefork pool's) must not use the connections it inherited, whose sockets its parent
    and siblings hold too: every engine gets a new pool, the old connections left to the parent (SQLAlchemy's
    documented recipe, ``dispose(close=False)``)."""
    for engine in list(_engines):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_new_pools_in_child)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """The engine for ``url``. Postgres: no ping before each checkout (it was a round trip per handling): a
    connection the database dropped fails its first statement, which invalidates every pooled connection as old
    (SQLAlchemy's own disconnect handling, and ``store.sql``'s), and the step is retried (``roles/retry.py``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = create_engine(url, **{"pool_size": 10, "max_overflow": 20, **kwargs})
        _engines.add(engine)
        return engine
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

    # SQLite's driver opens transactions lazily and deferred; two writers that both read
    # first then deadlock. Take the write lock at BEGIN instead (SQLAlchemy's documented recipe).
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to ``revision``; safe to call on every start."""
    if make_url(url).get_backend_name() == "sqlite":
        make_engine(url).dispose()  # creates the directory
    command.upgrade(alembic_config(url), revision)


def revisions(url: str, *, connect_timeout_s: float | None = None) -> tuple[str | None, str]:
    """The database's migration revision (None: never migrated) and the one this code needs."""
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None
    timeout = {} if connect_timeout_s is None or make_url(url).get_backend_name() == "sqlite" else {
        "connect_args": {"connect_timeout": max(1, round(connect_timeout_s))}}
    engine = make_engine(url, **timeout)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision(), head
    finally:
        engine.dispose()


@contextmanager
def scratch_database(admin_url: str, prefix: str = "agentfleet_scratch") -> Iterator[str]:
    """A new Postgres database migrated to head, dropped afterwards (tests, benchmarks)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # outlives a restart
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
