"""Live progress: what a run says of its steps on ``<ns>.public`` while it runs, when its goal asked for it
(``"progress": true``, inherited by its delegated children) or the fleet says every run does
(``AGENTFLEET_STEP_EVENTS``). Each notice is published once the step it tells of has committed and before the
event that starts the next step, so a consumer of the public exchange sees a run's steps in order. At most once:
a notice lost to a broker outage is not sent again (the trace is the record), and nothing here can fail a step.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import Connection

from agentfleet.events.contracts import (
    PlannedCall,
    RunWaitingNotice,
    StepPlannedNotice,
    ToolFinishedNotice,
    ToolStartedNotice,
)
from agentfleet.events.contracts import _StepNotice as StepNotice
from agentfleet.loop.transcript import ModelTurn, ToolResult
from agentfleet.roles.step import Step
from agentfleet.store.records import RunRecord

log = logging.getLogger(__name__)
TEXT_HEAD = 500  # characters of the model's text a step.planned notice carries


def wanted(step: Step, progress: bool) -> bool:
    return progress or step.rt.settings.step_events


def announce(step: Step, progress: bool, notice: StepNotice) -> None:
    if not wanted(step, progress):
        return
    try:
        step.rt.publisher.publish_public(notice.type, notice.model_dump(mode="json"), notice.run_id)
    except Exception as exc:  # a view, not the record: the step goes on
        log.warning("step notice %s not sent: %s", notice.type, exc)


def _now() -> datetime:
    return datetime.now(UTC)


def planned(step: Step, run: RunRecord, iteration: int, turn: ModelTurn, duration_ms: float) -> None:
    """``step.planned``, once the turn is committed."""
    if not wanted(step, run.progress):
        return
    announce(step, run.progress, StepPlannedNotice(
        run_id=run.run_id, trace_id=run.trace_id, agent=run.agent, iteration=iteration, at=_now(),
        parent_run_id=run.parent_run_id,
        calls=[PlannedCall(id=c.id, name=c.name, arguments=c.arguments) for c in turn.tool_calls],
        text=(turn.text or "")[:TEXT_HEAD] or None, input_tokens=turn.usage.input_tokens,
        output_tokens=turn.usage.output_tokens, duration_ms=duration_ms))


def tool_started(step: Step, progress: bool, agent: str, iteration: int, call_id: str, tool: str) -> None:
    announce(step, progress, ToolStartedNotice(
        run_id=step.env.run_id, trace_id=step.env.trace_id, agent=agent, iteration=iteration, at=_now(),
        call_id=call_id, tool=tool, worker=step.worker))


def tool_finished(step: Step, progress: bool, agent: str, iteration: int, call_id: str, tool: str,
                  result: ToolResult) -> None:
    announce(step, progress, ToolFinishedNotice(
        run_id=step.env.run_id, trace_id=step.env.trace_id, agent=agent, iteration=iteration, at=_now(),
        call_id=call_id, tool=tool, ok=result.ok, error_code=str(result.error_code) if result.error_code else None,
        duration_ms=result.duration_ms))


def waiting(step: Step, conn: Connection, run: RunRecord, waiting_for: Literal["approval", "children"],
            moved: object) -> None:
    """``run.waiting``, once the transition ``moved`` (truthy: it happened) commits."""
    if not moved or not wanted(step, run.progress):
        return
    notice = RunWaitingNotice(run_id=run.run_id, trace_id=run.trace_id, agent=run.agent, iteration=run.iteration,
                              at=_now(), parent_run_id=run.parent_run_id, waiting_for=waiting_for)
    step.rt.store.after_commit(conn, lambda: announce(step, run.progress, notice))

