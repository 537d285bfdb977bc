"""Clients of the distributed fleet: goals to the inbox, Results and progress back (``Client`` is the public one)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from kombu import Consumer, Message, Queue, binding

from agentfleet.config.settings import Settings
from agentfleet.constants import DOMAIN_ROUTING_PREFIX
from agentfleet.events.contracts import ApprovalAnswer, Result
from agentfleet.loop.keys import run_id_for
from agentfleet.ops.actions import Via, answer_approval, cancel_run, who
from agentfleet.roles.runtime import runtime_for
from agentfleet.workers.app import create_app
from agentfleet.workers.preflight import reach_all

# What a follower of a run binds on <ns>.public: step notices, run ends, approvals and graph steps.
FOLLOWED = ("step.planned", "tool.started", "tool.finished", "run.*", "approval.*", "graph.step")
RUN_ENDS = ("run.completed", "run.failed")


def _json(raw: Any) -> dict[str, Any] | None:
    try:
        found = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return found if isinstance(found, dict) else None


class _Tree:
    """Which notices belong to a run and the runs it delegated to: its own, then anything on its trace (learned
    from its first notice; every run of a tree shares its root's trace)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.trace_id: str | None = None

    def holds(self, notice: dict[str, Any]) -> bool:
        if notice.get("run_id") == self.run_id:
            self.trace_id = self.trace_id or notice.get("trace_id")
            return True
        return self.trace_id is not None and notice.get("trace_id") == self.trace_id


class FleetClient:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self.rt = runtime_for(self.app)
        self.connection = self.app.connection_for_write()

    def __enter__(self) -> FleetClient:
        reach_all(self.settings, "broker", "database")  # bounded; exit 69 naming the setting
        self.connection.ensure_connection(max_retries=3)
        self.rt.topology.declare(self.connection)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.connection.release()

    @staticmethod
    def run_id(body: dict[str, Any]) -> str:
        return run_id_for(body["agent"], body["goal_id"])

    def publish_goal(self, body: dict[str, Any], *, reply_to: str | None = None,
                     correlation_id: str | None = None) -> None:
        self.rt.publisher.publish_json(self.rt.topology.inbox, f"goal.{body['agent']}", body,
                                       reply_to=reply_to, correlation_id=correlation_id,
                                       declare=[self.rt.topology.inbox_queue])

    def publish_event(self, name: str, body: bytes, *, message_id: str | None = None) -> None:
        """A domain event, as outside systems send it: its payload as plain JSON under ``domain.<name>``."""
        self.rt.publisher.publish_json(self.rt.topology.inbox, f"{DOMAIN_ROUTING_PREFIX}{name}", body,
                                       declare=[self.rt.topology.inbox_queue],
                                       properties={"message_id": message_id} if message_id else None)

    def submit_and_wait(self, body: dict[str, Any], *, timeout_s: float,
                        on_tick: Callable[[], None] | None = None,
                        on_notice: Callable[[dict[str, Any]], None] | None = None) -> Result | None:
        """Publish the goal and wait for its Result on a private reply queue; None if the wait runs out.
        ``on_tick`` is called at least once a second meanwhile. ``on_notice``: the goal asks for ``progress``, and
        each notice of its run tree is handed over as it arrives (``follow``)."""
        for item in self.follow(body, timeout_s=timeout_s, notices=on_notice is not None, on_tick=on_tick):
            if isinstance(item, Result):
                return item
            if on_notice is not None:
                on_notice(item)
        return None

    def follow(self, body: dict[str, Any], *, timeout_s: float, notices: bool = True,
               on_tick: Callable[[], None] | None = None) -> Iterator[dict[str, Any] | Result]:
        """Publish the goal and yield, as they arrive and in order, the notices of its run tree on ``<ns>.public``
        (``notices``: the goal then asks for ``progress``; its steps, its children's, their ends, approvals), then
        its Result, last. The subscription is made before the goal is sent, so nothing is missed; a wait that runs
        out ends with no Result."""
        correlation_id = uuid.uuid4().hex
        reply_queue = Queue(f"{self.settings.namespace}.reply.{correlation_id}", exclusive=True, auto_delete=True)
        results: list[Result] = []
        heard: list[dict[str, Any]] = []
        tree = _Tree(self.run_id(body))

        def on_reply(message: Message) -> None:
            if message.properties.get("correlation_id") == correlation_id:
                results.append(Result.model_validate(json.loads(message.body)))
            message.ack()

        def on_public(message: Message) -> None:
            message.ack()
            notice = _json(message.body)
            if notice is not None and tree.holds(notice):
                heard.append(notice)

        consumers = [Consumer(self.connection, queues=[reply_queue], on_message=on_reply)]
        if notices:
            body = {**body, "progress": True}
            consumers.append(Consumer(self.connection, queues=[self._public_queue(correlation_id)],
                                      on_message=on_public))
        with contextlib.ExitStack() as stack:
            for consumer in consumers:
                stack.enter_context(consumer)
            self.publish_goal(body, reply_to=reply_queue.name, correlation_id=correlation_id)
            deadline = time.monotonic() + timeout_s
            while not results and time.monotonic() < deadline:
                if on_tick is not None:
                    on_tick()
                with contextlib.suppress(TimeoutError):
                    self.connection.drain_events(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                while heard:
                    yield heard.pop(0)
            if results and notices:  # the run's own end, sent before its Result, is in by now
                with contextlib.suppress(TimeoutError):
                    while True:
                        self.connection.drain_events(timeout=0.05)
            yield from heard
            yield from results[:1]

    def wait(self, run_id: str, *, timeout_s: float) -> Result | None:
        """The Result of a run submitted earlier (by anyone): from its end's notice on ``<ns>.public``, or from
        its checkpoint if it had ended before this looked; None if the wait runs out."""
        results: list[Result] = []

        def on_public(message: Message) -> None:
            message.ack()
            notice = _json(message.body)
            if notice is not None and notice.get("run_id") == run_id and notice.get("type") in RUN_ENDS:
                with contextlib.suppress(ValueError):
                    results.append(Result.model_validate({k: v for k, v in notice.items()
                                                          if k in Result.model_fields}))

        queue = Queue(f"{self.settings.namespace}.wait.{uuid.uuid4().hex}", exclusive=True, auto_delete=True,
                      bindings=[binding(self.rt.topology.public, routing_key=key) for key in RUN_ENDS])
        with Consumer(self.connection, queues=[queue], on_message=on_public):
            run = self.rt.store.get_run(run_id)  # bound first: an end after this read is heard
            if run is not None and run.result is not None:
                return Result.model_validate(run.result)
            deadline = time.monotonic() + timeout_s
            while not results and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    self.connection.drain_events(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        return results[0] if results else None

    def _public_queue(self, tag: str) -> Queue:
        """A private queue on ``<ns>.public`` for everything a run tree says there (steps, ends, approvals)."""
        public = self.rt.topology.public
        return Queue(f"{self.settings.namespace}.follow.{tag}", exclusive=True, auto_delete=True,
                     bindings=[binding(public, routing_key=key) for key in FOLLOWED])

    def cancel(self, run_id: str, reason: str, *, by: str | None = None, via: Via = "client") -> None:
        cancel_run(self.rt, run_id, reason, by=who(by), via=via)


class Client:
    """An application's handle on the distributed fleet (``agentfleet.Client``): submit goals, wait for their
    Results, follow a run's steps as they happen, cancel runs and answer approvals.

    Example::

        from agentfleet import Client

        with Client() as fleet:                          # AGENTFLEET_* settings, as the workers read them
            run_id = fleet.submit("repo_report", {"path": "."})
            result = fleet.wait(run_id, timeout_s=300)   # a Result, or None when the wait runs out

            for item in fleet.stream("repo_report", {"path": "."}):
                print(item)                              # step.planned, tool.started, ... then the Result

    Goals go through the public inbox exactly as any AMQP client sends them (admitted by the fleet, which
    answers a bad one with a ``rejected`` Result); progress comes from ``<ns>.public``, not from polling the
    database. Not thread-safe: one ``Client`` per thread.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        from agentfleet.config.settings import get_settings

        self._fleet = FleetClient(settings or get_settings())

    def __enter__(self) -> Client:
        self._fleet.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._fleet.__exit__(None, None, None)

    @staticmethod
    def goal(agent: str, input: dict[str, Any], *, goal_id: str | None = None,
             limits: dict[str, Any] | None = None, progress: bool = False,
             thread_id: str | None = None) -> dict[str, Any]:
        """The goal message (the public contract), checked as the inbox checks it (GoalRejected otherwise)."""
        from pydantic import ValidationError

        from agentfleet.errors import ErrorCode, GoalRejected
        from agentfleet.events.contracts import Goal

        try:
            goal = Goal(agent=agent, input=input, goal_id=goal_id or str(uuid.uuid4()), limits=limits or {},
                        progress=progress, thread_id=thread_id)
        except ValidationError as exc:
            problem = exc.errors()[0]
            raise GoalRejected(f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}",
                               code=ErrorCode.MALFORMED_MESSAGE) from None
        return goal.model_dump(mode="json", exclude_defaults=True) | {"goal_id": goal.goal_id}

    def submit(self, agent: str, input: dict[str, Any], *, goal_id: str | None = None,
               limits: dict[str, Any] | None = None, progress: bool = False, thread_id: str | None = None) -> str:
        """Publish a goal; its run id. The same ``goal_id`` again is the same run (its Result, not a new one);
        ``thread_id`` continues that conversation."""
        body = self.goal(agent, input, goal_id=goal_id, limits=limits, progress=progress, thread_id=thread_id)
        self._fleet.publish_goal(body)
        return self._fleet.run_id(body)

    def run(self, agent: str, input: dict[str, Any], *, goal_id: str | None = None,
            limits: dict[str, Any] | None = None, thread_id: str | None = None, timeout_s: float = 600.0) -> Result:
        """Submit a goal and wait for its Result (TimeoutError when ``timeout_s`` runs out first; the run goes on)."""
        body = self.goal(agent, input, goal_id=goal_id, limits=limits, thread_id=thread_id)
        result = self._fleet.submit_and_wait(body, timeout_s=timeout_s)
        if result is None:
            raise TimeoutError(f"run {self._fleet.run_id(body)} had not ended after {timeout_s}s (it goes on)")
        return result

    def stream(self, agent: str, input: dict[str, Any], *, goal_id: str | None = None,
               limits: dict[str, Any] | None = None, thread_id: str | None = None,
               timeout_s: float = 600.0) -> Iterator[dict[str, Any] | Result]:
        """Submit a goal with progress on and yield what its run tree says on ``<ns>.public`` as it happens (step
        notices as dicts, in order, masked; ``agentfleet schema`` prints their schemas), then its Result, last
        (TimeoutError when ``timeout_s`` runs out first)."""
        body = self.goal(agent, input, goal_id=goal_id, limits=limits, progress=True, thread_id=thread_id)
        ended = False
        for item in self._fleet.follow(body, timeout_s=timeout_s):
            ended = ended or isinstance(item, Result)
            yield item
        if not ended:
            raise TimeoutError(f"run {self._fleet.run_id(body)} had not ended after {timeout_s}s (it goes on)")

    def wait(self, run_id: str, *, timeout_s: float = 600.0) -> Result | None:
        """The Result of a run submitted earlier; None when ``timeout_s`` runs out first."""
        return self._fleet.wait(run_id, timeout_s=timeout_s)

    def cancel(self, run_id: str, reason: str = "cancelled by a client") -> None:
        """Ask the fleet to cancel a run (and the runs it delegated to); its Result says ``cancelled``."""
        self._fleet.cancel(run_id, reason)

    def approve(self, run_id: str, call_id: str, *, note: str | None = None,
                arguments: dict[str, Any] | None = None, by: str | None = None) -> ApprovalAnswer:
        """Approve a parked call (with ``arguments`` instead of the model's, checked against the tool's schema)."""
        return self._answer(run_id, call_id, "approve", note, arguments, by)

    def deny(self, run_id: str, call_id: str, reason: str, *, by: str | None = None) -> ApprovalAnswer:
        """Deny a parked call: the model is told ``reason`` and carries on."""
        return self._answer(run_id, call_id, "deny", reason, None, by)

    def schedule(self, name: str, agent: str, input: dict[str, Any], *, cron: str | None = None,
                 every_s: float | None = None, timezone: str = "UTC", jitter_s: float = 0.0,
                 catch_up: str = "latest", limits: dict[str, Any] | None = None,
                 thread_id: str | None = None) -> dict[str, Any]:
        """Add a schedule of goals for ``agent`` (``cron`` in ``timezone``, or every ``every_s``); observers fire
        each tick once. What ``schedule list`` shows of it."""
        from agentfleet.ops import schedules

        added = schedules.add_schedule(self._fleet.rt.store, name, agent, input, cron=cron, every_s=every_s,
                                       timezone=timezone, jitter_s=jitter_s, catch_up=catch_up,  # type: ignore[arg-type]
                                       limits=limits, thread_id=thread_id)
        return schedules.describe(added)

    def schedules(self) -> list[dict[str, Any]]:
        from agentfleet.ops import schedules

        return [schedules.describe(r) for r in self._fleet.rt.store.schedules_list()]

    def pause_schedule(self, name: str) -> None:
        from agentfleet.ops import schedules

        schedules.pause_schedule(self._fleet.rt.store, name)

    def resume_schedule(self, name: str) -> None:
        from agentfleet.ops import schedules

        schedules.resume_schedule(self._fleet.rt.store, name)

    def delete_schedule(self, name: str) -> None:
        from agentfleet.ops import schedules

        schedules.delete_schedule(self._fleet.rt.store, name)

    def _answer(self, run_id: str, call_id: str, decision: str, note: str | None, arguments: dict[str, Any] | None,
                by: str | None) -> ApprovalAnswer:
        return answer_approval(self._fleet.rt, run_id=run_id, call_id=call_id, decision=decision, by=who(by),
                               via="client", note=note, arguments=arguments)
