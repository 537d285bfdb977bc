"""The store on both databases it runs on: SQLite (embedded) and Postgres (distributed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfleet.store import Store, make_engine, upgrade


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_url")
    engine = make_engine(url)
    yield Store(engine)
    engine.dispose()
