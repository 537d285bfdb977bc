"""SQLAlchemy tables, the repository, and Alembic migrations."""

from agentfleet.store.db import make_engine, upgrade
from agentfleet.store.records import RunRecord, StepRecord
from agentfleet.store.repository import Store

__all__ = ["RunRecord", "StepRecord", "Store", "make_engine", "upgrade"]
