"""The fleet's shared secrets (the key that seals Redis entries), made once per database."""

from __future__ import annotations

from sqlalchemy import select

from agentfleet.store import tables as T
from agentfleet.store.base import StoreBase
from agentfleet.store.records import now


class Secrets(StoreBase):
    """The fleet's shared secrets."""

    def fleet_secret(self, name: str) -> str:
        """A secret every process of this fleet shares: made once (by whichever process asks first), then read.

        Read on a connection of its own, never pooled: the first process to need it may be a prefork worker's
        parent (its health timer seals what it writes), and a pooled connection would pass to its children."""
        import secrets

        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        own = self.engine if self.dialect == "sqlite" else create_engine(self.engine.url, poolclass=NullPool)
        try:
            with own.begin() as conn:
                self._insert_ignore(conn, T.fleet_secrets, {"name": name, "value": secrets.token_hex(32),
                                                            "created_at": now()}, ["name"])
                stmt = select(T.fleet_secrets.c.value).where(T.fleet_secrets.c.name == name)
                return str(conn.execute(stmt).scalar_one())
        finally:
            if own is not self.engine:
                own.dispose()
