"""What the observer's approvals timer costs a fleet at rest: it looks every ``approval_poll_s`` (a second) in every
observer, whether or not anything waits on a person, so each look is one pooled connection: the fleet-wide lock and
both reads on it, not a connection for each."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from agentfleet.config.settings import get_settings
from agentfleet.roles import approvals
from agentfleet.roles.runtime import close_runtime, runtime_for
from agentfleet.store import db
from agentfleet.workers.app import create_app

pytestmark = pytest.mark.integration


def test_a_look_with_nothing_to_do_takes_one_connection(distributed_env: dict[str, str]) -> None:
    settings = get_settings()
    db.upgrade(settings.effective_database_url)
    app = create_app(settings)
    rt = runtime_for(app)
    taken: list[Any] = []
    event.listen(rt.store.engine, "checkout", lambda *args: taken.append(args))
    try:
        for _ in range(3):
            assert approvals.tick(rt) == (0, 0)
        assert len(taken) == 3, f"{len(taken)} connections taken for 3 looks"
    finally:
        close_runtime(app)
