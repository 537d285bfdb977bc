"""The hook seam: one list every step, tool call, model call and run transition passes through.

Like Dramatiq's middleware: a base class of empty methods, so a hook overrides only
what it watches. Metrics, tracing and the audit log are hooks (``hooks/metrics.py``,
``hooks/tracing.py``, ``hooks/audit.py``), not edits in handlers; users add their own
with ``AGENTFLEET_HOOKS``. Hooks get typed records, never a database connection: the
audit row is the store's to write, in the transition's own transaction.

What a hook may break is decided here, once. Watching must not stop work: an
exception from a ``before_*`` or ``after_*`` method is logged and the step goes on.
``on_transition`` runs inside the transaction that moves the run; an exception there
fails the step's attempt (it is retried like any database error), so a hook that must
see every committed move (``after_transition``) never misses one it vetoed.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentfleet.loop.transcript import ModelTurn, ToolResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    """One handling of one event by one role (what ``run_event`` is doing)."""

    role: str
    event_type: str
    event_id: str
    run_id: str
    trace_id: str
    worker: str
    redelivered: bool = False
    started: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class ToolCallInfo:
    """A tool call the executor finished with a result; ``ran`` is False when the result came without running it
    (a policy denial, an answer to an approval, an unknown tool, an outcome an earlier attempt left unknown)."""

    run_id: str
    agent: str
    tool: str  # the agent's tool, or UNKNOWN_TOOL: names a model made up must not become metric labels
    call_id: str
    attempt: int
    ran: bool = True
    requested: str = ""  # the name the model asked for, as it asked


UNKNOWN_TOOL = "(unknown)"


@dataclass(frozen=True)
class ModelCallInfo:
    run_id: str
    agent: str
    model: str
    iteration: int


@dataclass(frozen=True)
class Transition:
    """A run moved from one state to another (the compare-and-set on its row succeeded): what moved it (the
    event and the worker handling it; none when the sweeper or the CLI did), why (the error code a run ended
    with), how long the step had taken, and what the run had cost by then. The audit trail is these records."""

    run_id: str
    agent: str
    from_state: str
    to_state: str
    at: datetime
    iteration: int
    error_code: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    worker: str = ""
    event_id: str | None = None
    event_type: str | None = None
    step_duration_ms: float | None = None

    def record(self) -> dict[str, Any]:
        """The transition as one audit record (a row of the ``audit`` table, a line of the audit log)."""
        return dict(
            at=self.at, run_id=self.run_id, agent=self.agent, from_state=str(self.from_state),
            to_state=str(self.to_state), iteration=self.iteration, event_id=self.event_id,
            event_type=self.event_type, reason=self.error_code, step_duration_ms=self.step_duration_ms,
            input_tokens=self.input_tokens, output_tokens=self.output_tokens, cost_usd=self.cost_usd,
            worker=self.worker[:255],
        )


class Hook:
    """Base of every hook: each method does nothing."""

    def before_step(self, step: StepInfo) -> None:
        """An event is about to be handled."""

    def after_step(self, step: StepInfo, outcome: str, error: BaseException | None, duration_s: float) -> None:
        """It was: ``outcome`` is published, duplicate, dead-lettered, retried, in-flight, or error (``error``)."""

    def before_tool(self, call: ToolCallInfo) -> None:
        """A tool is about to run (not called for results given without running it)."""

    def after_tool(self, call: ToolCallInfo, result: ToolResult) -> None:
        """A call has its result (once per call, however often its event is delivered)."""

    def before_model(self, call: ModelCallInfo) -> None:
        """The model is about to be asked (each try of the planner's retries)."""

    def after_model(self, call: ModelCallInfo, turn: ModelTurn | None, error: BaseException | None,
                    duration_s: float) -> None:
        """It answered ``turn``, or raised ``error``."""

    def on_transition(self, change: Transition) -> None:
        """A run is changing state, inside that change's transaction: raising fails the step's attempt (see the
        module's note). A hook gets the change as data; what the store records with it, the store writes."""

    def after_transition(self, change: Transition) -> None:
        """That change has committed (counting here never counts a move that was rolled back)."""


_current_step: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar("agentfleet_step", default=None)


def current_step() -> StepInfo | None:
    """The step this thread is handling, if any (a transition made by the sweeper or the CLI has none)."""
    return _current_step.get()


class StepWatch:
    """What ``Hooks.step`` hands its caller: set ``outcome`` before leaving the block (also when leaving it by
    an exception that is not an error, such as Celery's Retry); left unset, it is "error"."""

    outcome: str | None = None


class Hooks:
    """The configured hooks, called in order (and ``after_*`` in reverse, like nested middleware)."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = tuple(hooks)
        self._reversed = tuple(reversed(self.hooks))

    def find(self, kind: type[Any]) -> Any | None:
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    def _each(self, hooks: Sequence[Hook], method: str, *args: Any) -> None:
        for hook in hooks:
            try:
                getattr(hook, method)(*args)
            except Exception:
                log.exception("hook %s.%s failed; the step goes on", type(hook).__name__, method)

    @contextmanager
    def step(self, info: StepInfo) -> Iterator[StepWatch]:
        """Around one event's handling: the step is current for transitions made inside it."""
        watch = StepWatch()
        token = _current_step.set(info)
        self._each(self.hooks, "before_step", info)
        error: BaseException | None = None
        try:
            yield watch
        except BaseException as exc:
            error = exc
            raise
        finally:
            _current_step.reset(token)
            self._each(self._reversed, "after_step", info, watch.outcome or "error", error,
                       time.perf_counter() - info.started)

    def before_tool(self, call: ToolCallInfo) -> None:
        self._each(self.hooks, "before_tool", call)

    def after_tool(self, call: ToolCallInfo, result: ToolResult) -> None:
        self._each(self._reversed, "after_tool", call, result)

    @contextmanager
    def model_call(self, call: ModelCallInfo) -> Iterator[list[ModelTurn]]:
        """Around one request to the model: append the turn to the yielded list once it came."""
        got: list[ModelTurn] = []
        self._each(self.hooks, "before_model", call)
        started = time.perf_counter()
        try:
            yield got
        except BaseException as exc:
            self._each(self._reversed, "after_model", call, None, exc, time.perf_counter() - started)
            raise
        self._each(self._reversed, "after_model", call, got[0] if got else None, None, time.perf_counter() - started)

    def on_transition(self, change: Transition) -> None:
        for hook in self.hooks:  # not guarded: see the module's note
            hook.on_transition(change)

    def after_transition(self, change: Transition) -> None:
        self._each(self._reversed, "after_transition", change)

