"""Recording a real run to a cassette ``ReplayModel`` reads back strictly.

A model wrapper: each call's request (messages, the tools offered, a fingerprint) and the model's turn
are appended to the cassette and the file rewritten whole (atomically), so a run cut short still leaves
every exchange it had. One run per cassette: the first run the wrapper sees; other runs of the same agent
in the process are not recorded.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from agentfleet.loop.transcript import ModelTurn
from agentfleet.models.base import Model, ModelRequest
from agentfleet.models.replay import Cassette, RecordedTurn, fingerprint


class RecordingModel:
    def __init__(self, model: Model, path: str | Path, *, agent: str, goal: dict[str, Any] | None = None) -> None:
        self.model = model
        self.path = Path(path)
        self.cassette = Cassette(model=model.name, description=f"recorded run of agent {agent}", turns=[],
                                 agent=agent, goal=goal)
        self._run_id: str | None = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # name, offline, context_window: the recorded model's
        return getattr(self.model, name)

    def complete(self, request: ModelRequest) -> ModelTurn:
        turn = self.model.complete(request)
        with self._lock:
            self._run_id = self._run_id or request.run_id
            if request.run_id == self._run_id:
                if self.cassette.goal is None:
                    self.cassette.goal = request.goal
                del self.cassette.turns[request.iteration:]  # a re-planned iteration replaces its recording
                self.cassette.turns.append(RecordedTurn(
                    text=turn.text, tool_calls=turn.tool_calls, usage=turn.usage, stop_reason=turn.stop_reason,
                    malformed=turn.malformed, fingerprint=fingerprint(request), messages=request.messages,
                    tools=[t.get("name", "") for t in request.tools]))
                self.save()
        return turn

    def finish(self, result: dict[str, Any]) -> None:
        """Keep the run's Result with its recording (what a replay is compared against)."""
        with self._lock:
            self.cassette.result = result
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.cassette.model_dump_json(indent=1, exclude_none=True))
        os.replace(tmp, self.path)
