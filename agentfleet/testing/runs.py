"""One goal through a whole fleet in the test's process: how an agent's own tests run it.

The fleet is the embedded one (memory broker, SQLite in a scratch directory): the same planner, executor
and observer code as production, with the agent on the model the test chooses — a ``ScriptedModel``, a
``ReplayModel`` of a recorded run, or a spec string.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from agentfleet.config.settings import Settings
from agentfleet.errors import ConfigurationError
from agentfleet.events.contracts import Result
from agentfleet.models.base import Model
from agentfleet.models.spec import model_from_spec
from agentfleet.ops.progress import wait_for_end
from agentfleet.workers.embedded import EmbeddedFleet


def run_goal(agent: str, input: dict[str, Any], *, agents: str, model: Model | str | None = None,
             workspace: str | Path | None = None, timeout_s: float = 60.0, **goal: Any) -> Result:
    """The Result of ``agent`` (declared in the modules ``agents`` names) on ``input``; ``goal`` may add
    ``limits`` or ``goal_id``. ``workspace``: the tools' directory (a scratch one by default)."""
    with tempfile.TemporaryDirectory(prefix="agentfleet-run-") as scratch:
        settings = Settings(profile="embedded", agents=agents, workspace=Path(workspace or scratch),
                            embedded_database_url=f"sqlite:///{scratch}/fleet.db")
        with EmbeddedFleet(settings) as fleet:
            if model is not None:
                fleet.use_model(agent, model_from_spec(model) if isinstance(model, str) else model)
            run_id = fleet.submit({"agent": agent, "input": input, **goal})
            run = wait_for_end(fleet.store, run_id, timeout_s=timeout_s)
            if run is None or run.result is None:
                raise ConfigurationError(f"run {run_id} of {agent} did not end within {timeout_s}s")
            return Result.model_validate(run.result)
