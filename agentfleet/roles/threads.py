"""Threads: one run at a time per conversation. A goal naming a busy thread makes its run and leaves it pending
(in the database: no worker holds it, no message is held unacked); the end of the thread's running run gives the
oldest pending one its turn by sending its goal again (an event whose id derives from both runs, so an end handled
twice gives one turn). The sweeper leaves a run waiting for its turn alone, and re-sends the goal of one whose
turn came but whose goal was lost."""

from __future__ import annotations

from sqlalchemy import Connection

from agentfleet.events.envelope import Envelope, EventType, GoalSubmitted
from agentfleet.loop.keys import derived_event_id
from agentfleet.loop.states import RunState
from agentfleet.roles.step import Step


def next_turn(step: Step, conn: Connection, thread_id: str) -> list[Envelope]:
    """The goal of the thread's oldest pending run, if no run of the thread is going now; to commit with the
    handling of the end that freed the thread (which holds the thread's row: ``Store.hold_thread``)."""
    store = step.rt.store
    store.hold_thread(conn, thread_id)
    turn = store.thread_turn(conn, thread_id)
    if turn is None or turn.state != RunState.PENDING:
        return []
    goal = GoalSubmitted(agent=turn.agent, goal_id=turn.goal_id, input=turn.input, limits=turn.limits,
                         progress=turn.progress, thread_id=thread_id)
    return [Envelope.new(EventType.GOAL_SUBMITTED, turn.run_id, goal, trace_id=turn.trace_id,
                         causation_id=step.env.event_id,
                         event_id=derived_event_id(turn.run_id, "thread-turn", step.env.run_id))]
