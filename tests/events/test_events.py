from __future__ import annotations

import pytest

import agentfleet.examples.repo_report  # noqa: F401  (registers repo_report)
from agentfleet import constants as C
from agentfleet.agents.registry import registry
from agentfleet.errors import ErrorCode, GoalRejected, MalformedEvent
from agentfleet.events import CONSUMERS, Envelope, EventType, Goal, Result, Topology, decode, parse_goal
from agentfleet.events.envelope import PAYLOADS, GoalSubmitted
from agentfleet.loop.keys import run_id_for
from agentfleet.roles.admission import admit, goal_event
from agentfleet.roles.catalog import HANDLERS


class TestEnvelope:
    def test_an_envelope_round_trips_through_its_wire_form(self) -> None:
        env = Envelope.new(EventType.GOAL_SUBMITTED, "run", GoalSubmitted(agent="a", goal_id="g", input={}),
                           trace_id="t")
        again = decode(env.wire())
        assert again == env and isinstance(again.body(), GoalSubmitted)

    @pytest.mark.parametrize("raw", [None, "text", {}, {"event_id": "e", "type": "no.such.type"}])
    def test_a_malformed_envelope_is_refused(self, raw: object) -> None:
        with pytest.raises(MalformedEvent):
            decode(raw)

    def test_a_payload_that_does_not_fit_its_type_is_malformed(self) -> None:
        env = Envelope.new(EventType.GOAL_SUBMITTED, "run", GoalSubmitted(agent="a", goal_id="g", input={}),
                           trace_id="t")
        broken = decode({**env.wire(), "payload": {"agent": 1}})
        with pytest.raises(MalformedEvent):
            broken.body()

    def test_every_event_type_has_a_payload_model(self) -> None:
        assert set(PAYLOADS) == set(EventType)


class TestTopology:
    def test_every_consumed_type_has_exactly_one_role_and_one_handler(self) -> None:
        assert set(CONSUMERS) == set(HANDLERS)
        assert set(CONSUMERS.values()) == set(C.ROLES)

    def test_every_consuming_queue_dead_letters_to_the_dead_exchange(self) -> None:
        topo = Topology("ns")
        for queue in [*topo.role_queues.values(), topo.inbox_queue]:
            assert queue.queue_arguments == {"x-dead-letter-exchange": "ns.dead"}
        assert topo.dead.type == "fanout"

    def test_role_queues_bind_exactly_the_types_they_consume(self) -> None:
        topo = Topology()
        bound = {b.routing_key for b in topo.role_queues[C.EXECUTOR].bindings}
        assert bound == {"tool.requested"}
        assert topo.role_queues[C.PLANNER].name == "agentfleet.planner"

    def test_names_follow_the_public_contract_by_default(self) -> None:
        topo = Topology()
        assert {topo.inbox.name, topo.events.name, topo.public.name, topo.dead.name} == {
            "agentfleet.inbox", "agentfleet.events", "agentfleet.public", "agentfleet.dead"}


class TestGoals:
    def test_a_goal_parses_from_json_bytes(self) -> None:
        goal = parse_goal(b'{"agent": "repo_report", "input": {"path": "."}, "goal_id": "g1"}')
        assert goal == Goal(agent="repo_report", input={"path": "."}, goal_id="g1")

    def test_the_agent_may_come_from_the_routing_key(self) -> None:
        assert parse_goal(b'{"input": {}}', "goal.x").agent == "x"

    @pytest.mark.parametrize("body", [b"not json", b"\xff\xfe", b"[1, 2]", b'"str"', b'{"agent": "a"}',
                                      b'{"agent": "a", "input": [], "x": 1}', b'{"agent": "a", "input": {},'
                                      b' "limits": {"max_steps": -1}}'])
    def test_malformed_goals_are_rejected_as_malformed(self, body: bytes) -> None:
        with pytest.raises(GoalRejected) as err:
            parse_goal(body)
        assert err.value.code == ErrorCode.MALFORMED_MESSAGE

    def test_admission_rejects_an_unknown_agent(self) -> None:
        with pytest.raises(GoalRejected) as err:
            admit(registry, {"agent": "nobody", "input": {}})
        assert err.value.code == ErrorCode.UNKNOWN_AGENT and "repo_report" in err.value.message

    def test_admission_rejects_input_that_breaks_the_goal_schema(self) -> None:
        with pytest.raises(GoalRejected) as err:
            admit(registry, {"agent": "repo_report", "input": {"path": 3}})
        assert err.value.code == ErrorCode.INPUT_INVALID and "path" in err.value.message

    def test_admission_rejects_a_routing_key_that_names_another_agent(self) -> None:
        with pytest.raises(GoalRejected):
            admit(registry, {"agent": "repo_report", "input": {"path": "."}}, "goal.other")

    def test_an_admitted_goal_gets_a_goal_id_and_a_deterministic_run(self) -> None:
        goal = admit(registry, {"agent": "repo_report", "input": {"path": "."}})
        assert goal.goal_id
        first, second = goal_event(goal), goal_event(goal)
        assert first.run_id == second.run_id == run_id_for("repo_report", goal.goal_id)
        assert first.event_id != second.event_id  # each copy is its own message

    def test_a_rejection_result_carries_the_documented_fields(self) -> None:
        result = Result.rejection(ErrorCode.INPUT_INVALID, "bad", agent="a", goal_id="g")
        assert result.status == "rejected" and result.recovery_suggestion and result.run_id is None


@pytest.mark.parametrize("stored", [
    # an envelope missing a field, carrying a call whose arguments a tool's schema marks secret (no secret-like name)
    {"event_id": "e", "type": "tool.requested", "run_id": "r", "trace_id": "t",
     "payload": {"iteration": 1, "call": {"id": "c", "name": "pay", "arguments": {"account": "acct-4417-private"}}}},
    # a whole envelope whose payload no longer fits its model
    {"event_id": "e", "type": "tool.requested", "run_id": "r", "trace_id": "t", "occurred_at": "2026-12-07T00:00:00Z",
     "payload": {"iteration": "one", "call": {"id": "c", "arguments": {"account": "acct-4417-private"}}}},
])
def test_an_event_that_does_not_validate_is_told_by_where_and_why_never_by_what_it_holds(stored: dict) -> None:
    """A stored event that no longer validates (a model changed across an upgrade) is re-driven by the sweeper, which
    logs the error with its traceback: the message and the chained pydantic error both quoted the event's content,
    arguments and all, where log redaction sees only secret-like names and patterns, not a tool's schema."""
    import traceback

    with pytest.raises(MalformedEvent) as caught:
        decode(stored).body()
    told = "".join(traceback.format_exception(caught.value))
    assert "acct-4417-private" not in told, told
    assert "invalid" in str(caught.value) and ("occurred_at" in told or "iteration" in told)
