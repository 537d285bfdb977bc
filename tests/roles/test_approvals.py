"""Approvals: the policy (pure), redaction, and the durable wait end to end on the embedded fleet."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from agentfleet import Agent, ScriptedModel, tool
from agentfleet.config.settings import Settings
from agentfleet.errors import ApprovalRefused, ConfigurationError, ErrorCode
from agentfleet.events.contracts import ApprovalResolve
from agentfleet.events.envelope import Envelope, EventType, RunCancelRequested
from agentfleet.loop.decisions import waits_on_people
from agentfleet.loop.states import RunState
from agentfleet.ops.progress import describe_run
from agentfleet.redaction import redact
from agentfleet.roles.approvals import resolve
from agentfleet.tools.policy import ApprovalRule, evaluate, rules_from_json
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, eventually, wait_for_run

# -- the policy ------------------------------------------------------------------------------------

SUDO = ApprovalRule(tool="shell", match={"command": r"^sudo\b"}, reason="sudo needs a person", expires_s=60)
RM = ApprovalRule(tool="shell", action="deny", match={"command": r"rm\s+-rf"}, reason="no recursive deletes",
                  name="no-rm-rf")
BIG = ApprovalRule(tool="pay*", above={"/order/amount": 100}, reason="large payments")


def test_deny_rules_come_first_then_the_tools_flag_then_ask_rules() -> None:
    assert evaluate("shell", {"command": "sudo rm -rf /"}, rules=[SUDO, RM]) == \
        evaluate("shell", {"command": "sudo rm -rf /"}, rules=[RM, SUDO])
    denied = evaluate("shell", {"command": "sudo rm -rf /"}, rules=[SUDO, RM], requires_approval=True)
    assert (denied.action, denied.rule, denied.reason) == ("deny", "no-rm-rf", "no recursive deletes")
    asked = evaluate("shell", {"command": "sudo ls"}, rules=[SUDO, RM])
    assert (asked.action, asked.reason, asked.expires_s) == ("ask", "sudo needs a person", 60)
    assert evaluate("shell", {"command": "ls -la"}, rules=[SUDO, RM]).action == "allow"
    assert evaluate("other", {"command": "sudo ls"}, rules=[SUDO, RM]).action == "allow"
    flagged = evaluate("shell", {"command": "ls"}, requires_approval=True, expires_s=5)
    assert (flagged.action, flagged.rule, flagged.expires_s) == ("ask", "shell.requires_approval", 5)


def test_conditions_read_arguments_by_name_or_pointer_and_a_missing_one_holds_nothing() -> None:
    assert evaluate("payment", {"order": {"amount": 101}}, rules=[BIG]).action == "ask"
    assert evaluate("payment", {"order": {"amount": 100}}, rules=[BIG]).action == "allow"
    assert evaluate("payment", {"order": {"amount": "1000"}}, rules=[BIG]).action == "allow"  # not a number
    assert evaluate("payment", {"order": {"amount": True}}, rules=[BIG]).action == "allow"
    assert evaluate("payment", {}, rules=[BIG]).action == "allow"
    nested = ApprovalRule(tool="t", match={"/to/0": "@evil\\.com$"}, reason="outside mail")
    assert evaluate("t", {"to": ["a@evil.com"]}, rules=[nested]).action == "ask"
    assert evaluate("t", {"to": []}, rules=[nested]).action == "allow"
    assert BIG.label == "ask pay* if /order/amount>100"


def test_a_policy_that_cannot_be_read_fails_closed() -> None:
    def broken(args: dict[str, Any]) -> bool:
        raise KeyError("amount")

    rule = ApprovalRule(tool="t", when=broken, reason="r")
    verdict = evaluate("t", {}, rules=[rule])
    assert verdict.action == "ask" and "KeyError" in (verdict.reason or "")
    assert evaluate("t", {}, requires_approval=broken).action == "ask"
    assert evaluate("t", {"n": 1}, requires_approval=lambda a: a["n"] > 5).action == "allow"
    assert evaluate("t", {"n": 9}, requires_approval=lambda a: a["n"] > 5).action == "ask"


def test_rules_from_settings_and_declarations_are_checked_at_start_up() -> None:
    rules = rules_from_json('[{"tool": "shell", "match": {"command": "^sudo"}, "reason": "sudo"}]')
    assert rules[0].action == "ask"
    for bad, where in (('[{"tool": "shell"}]', "reason"), ('[{"reason": "r", "match": {"c": "("}}]', "match"),
                       ('[{"reason": "r", "action": "maybe"}]', "action"), ('{"reason": "r"}', "JSON list")):
        with pytest.raises(ConfigurationError, match="AGENTFLEET_APPROVAL_RULES") as exc:
            rules_from_json(bad)
        assert where in str(exc.value)
    with pytest.raises(ConfigurationError):
        Settings(approval_rules='[{"tool": "x"}]')

    @tool
    def act(n: int) -> dict:
        """Act."""
        return {}

    with pytest.raises(ConfigurationError, match="covers none of its tools"):
        Agent("typo_rules", instructions="", model=ScriptedModel([]), goal_schema={}, result_schema={},
              tools=[act], approval_rules=[ApprovalRule(tool="acts", reason="r")], register=False)
    with pytest.raises(ConfigurationError, match="cannot also require approval"):
        tool(read_only=True, requires_approval=True)(act.func)
    with pytest.raises(ConfigurationError, match="approval_expires_s"):
        tool(requires_approval=True, approval_expires_s=0)(act.func)


def test_secrets_are_masked_by_schema_and_by_name_at_any_depth() -> None:
    @tool
    def login(user: str, secret_word: SecretStr, options: dict) -> dict:
        """Log in."""
        return {}

    shown = redact({"user": "ann", "secret_word": "x", "options": {"api_key": "k", "n": [{"token": "t"}]}},
                   login.parameters)
    assert shown == {"user": "ann", "secret_word": "***", "options": {"api_key": "***", "n": [{"token": "***"}]}}
    schema = {"properties": {"pin": {"type": "string", "writeOnly": True}}}
    assert redact({"pin": "1234", "Password": "p"}, schema) == {"pin": "***", "Password": "***"}


def test_a_run_waits_only_when_every_call_still_out_is_parked() -> None:
    assert waits_on_people(["a", "b"], ["b"], ["a"])
    assert not waits_on_people(["a", "b"], [], ["a"])  # b still runs
    assert not waits_on_people(["a", "b"], ["a", "b"], [])  # complete: observe, not wait
    assert not waits_on_people(["a"], [], [])


# -- the wait, end to end (embedded) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("ws"), "tests.fixtures.agents",
                        AGENTFLEET_APPROVAL_POLL_S="0.1") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


def start(fleet: EmbeddedFleet, *calls: list[Any]) -> str:
    return fleet.submit({"agent": "payer", "input": {"calls": list(calls)}, "goal_id": uuid.uuid4().hex})


def waiting(fleet: EmbeddedFleet, run_id: str) -> None:
    eventually(lambda: (run := fleet.store.get_run(run_id)) is not None and run.state == RunState.WAITING_APPROVAL)


def answer(fleet: EmbeddedFleet, run_id: str, call_id: str, decision: str = "approve", by: str = "ann",
           **fields: Any) -> Any:
    # publish=False: as the CLI beside an embedded fleet; the observer's timer finds the answer.
    return resolve(fleet.runtime, ApprovalResolve(run_id=run_id, call_id=call_id, decision=decision,  # type: ignore
                                                  **fields), by, publish=False)


def ledger(fleet: EmbeddedFleet, run_id: str) -> list[str]:
    path = fleet.workspace / f"ledger-{run_id}.txt"  # type: ignore[attr-defined]
    return path.read_text().splitlines() if path.exists() else []


def test_an_approved_call_runs_once_with_the_edited_arguments_and_who_answered_is_kept(
        fleet: EmbeddedFleet) -> None:
    run_id = start(fleet, ["p", "pay", {"payee": "acme", "amount": 500, "token": "s3cret"}])
    waiting(fleet, run_id)
    assert ledger(fleet, run_id) == []  # nothing ran while it waits
    [pending] = fleet.store.pending_approvals(run_id=run_id)
    assert pending.shown == {"payee": "acme", "amount": 500, "token": "***"}
    with pytest.raises(ApprovalRefused) as bad:
        answer(fleet, run_id, "p", arguments={"payee": "acme", "amount": 5000})
    assert bad.value.code == ErrorCode.INVALID_ARGUMENTS and "stays pending" in bad.value.message
    assert fleet.store.pending_approvals(run_id=run_id)  # still waiting
    accepted = answer(fleet, run_id, "p", arguments={"payee": "acme", "amount": 50}, note="half now")
    assert (accepted.status, accepted.decision, accepted.by) == ("accepted", "approved", "ann")
    with pytest.raises(ApprovalRefused) as again:
        answer(fleet, run_id, "p", decision="deny", by="bob")
    assert again.value.code == ErrorCode.APPROVAL_NOT_PENDING and "approved by ann" in again.value.message
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded", result
    # The model is told a person approved it, and that it ran with other arguments than it asked for.
    assert result["output"]["seen"] == [{"ok": True, "output": {"paid": "acme", "amount": 50}, "approval": {
        "by": "ann", "note": "half now", "ran_with": {"payee": "acme", "amount": 50}}}]
    assert [line.split(":")[:3] for line in ledger(fleet, run_id)] == [["pay", "acme", "50"]]
    [history] = describe_run(fleet.store, run_id)["approvals"]  # type: ignore[index]
    assert (history["status"], history["resolved_by"], history["note"]) == ("approved", "ann", "half now")
    assert history["edited_arguments"] == {"payee": "acme", "amount": 50}


def test_an_edit_that_leaves_a_masked_value_masked_keeps_the_original_by_every_way_of_answering(
        fleet: EmbeddedFleet) -> None:
    """Every answerer sees a parked call's arguments masked (the CLI, the public exchange, the console): an edit made
    from what it saw holds ``***`` where a secret was. That keeps the secret the model sent, decided under the
    request's lock; it is never sent on as ``***``, nor does the secret go out to be sent back."""
    run_id = start(fleet, ["p", "pay", {"payee": "acme", "amount": 500, "token": "s3cret-token"}])
    waiting(fleet, run_id)
    accepted = answer(fleet, run_id, "p", arguments={"payee": "globex", "amount": 50, "token": "***"})
    assert accepted.status == "accepted"
    assert wait_for_run(fleet.store, run_id, timeout=30).result["status"] == "succeeded"  # type: ignore[index]
    [ran] = [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"]
    assert ran["input"] == {"payee": "globex", "amount": 50, "token": "s3cret-token"}
    [history] = fleet.store.approvals_of(run_id)
    assert history.summary()["edited_arguments"] == {"payee": "globex", "amount": 50, "token": "***"}


def test_rules_decide_on_the_values_the_tool_will_receive_and_exactly_those_run(fleet: EmbeddedFleet) -> None:
    """Containment 11: "5000", "5e3" and " 5000 " skipped a numeric rule, then the tool's lenient binding paid
    5,000 with no approval. Bound first, each is 5000.0: each waits for a person, and runs as bound."""
    run_id = start(fleet, ["a", "transfer", {"to": "x", "amount_usd": "5000"}],
                   ["b", "transfer", {"to": "x", "amount_usd": "5e3"}],
                   ["c", "transfer", {"to": "x", "amount_usd": " 5000 "}],
                   ["d", "transfer", {"to": "x", "amount_usd": "50"}])
    waiting(fleet, run_id)
    pending = fleet.store.pending_approvals(run_id=run_id)
    assert sorted(p.call_id for p in pending) == ["a", "b", "c"]
    assert all(p.arguments == {"to": "x", "amount_usd": 5000.0} for p in pending)  # what will run, as bound
    assert [line.split(":")[:3] for line in ledger(fleet, run_id)] == [["transfer", "x", "50"]]
    for call_id in "abc":
        answer(fleet, run_id, call_id, decision="deny", by="bob", note="no")
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded"
    assert len(ledger(fleet, run_id)) == 1
    [ran] = [s for s in fleet.store.steps(run_id) if s["call_id"] == "d" and s["kind"] == "tool"]
    assert ran["input"] == {"to": "x", "amount_usd": 50.0}  # the step records the bound values it ran with


def test_a_denied_call_is_a_result_for_the_model_and_the_run_carries_on(fleet: EmbeddedFleet) -> None:
    run_id = start(fleet, ["p", "pay", {"payee": "mallory", "amount": 900}])
    waiting(fleet, run_id)
    answer(fleet, run_id, "p", decision="deny", by="bob", note="unknown payee")
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded"
    [seen] = result["output"]["seen"]
    assert seen["error_code"] == ErrorCode.APPROVAL_DENIED and "bob denied pay: unknown payee" in seen["message"]
    assert ledger(fleet, run_id) == []


def test_an_unanswered_request_expires_as_a_denial_of_its_own(fleet: EmbeddedFleet) -> None:
    run_id = start(fleet, ["s", "pay_soon", {"payee": "acme", "amount": 5}])
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None
    [seen] = result["output"]["seen"]
    assert seen["error_code"] == ErrorCode.APPROVAL_EXPIRED
    [history] = fleet.store.approvals_of(run_id)
    assert history.status == "expired" and history.resolved_by and history.expires_at is not None
    with pytest.raises(ApprovalRefused, match="already expired"):
        answer(fleet, run_id, "s")


def test_rules_deny_outright_or_ask_and_other_calls_of_the_iteration_are_not_held_back(
        fleet: EmbeddedFleet) -> None:
    switch = f"open-{uuid.uuid4().hex}"
    run_id = start(fleet, ["rm", "shell", {"command": "rm -rf /"}], ["ls", "shell", {"command": "ls"}],
                   ["su", "shell", {"command": "sudo reboot"}], ["w", "wait_for_switch", {"name": switch}])
    eventually(lambda: fleet.store.pending_approvals(run_id=run_id))
    # The rm and ls calls finish, the wait_for_switch call is still running: the run executes, not waits.
    eventually(lambda: {s["call_id"] for s in fleet.store.steps(run_id) if s["status"] != "started"} >= {"rm", "ls"})
    assert fleet.store.get_run(run_id).state == RunState.EXECUTING  # type: ignore[union-attr]
    (fleet.workspace / switch).touch()  # type: ignore[attr-defined]
    waiting(fleet, run_id)
    [pending] = fleet.store.pending_approvals(run_id=run_id)
    assert (pending.call_id, pending.reason) == ("su", "sudo needs a person")
    answer(fleet, run_id, "su")
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None
    by_call = dict(zip(["ls", "rm", "su", "w"], result["output"]["seen"], strict=True))
    assert by_call["rm"]["error_code"] == ErrorCode.PERMISSION_DENIED and "no-rm-rf" in by_call["rm"]["message"]
    assert by_call["ls"]["output"] == {"would_run": "ls"}
    assert by_call["su"]["output"] == {"would_run": "sudo reboot"}
    assert by_call["w"]["output"] == {"switch": switch}


def test_answers_to_nothing_or_to_an_ended_run_are_refused(fleet: EmbeddedFleet) -> None:
    with pytest.raises(ApprovalRefused) as unknown:
        answer(fleet, "no-such-run", "p")
    assert unknown.value.code == ErrorCode.UNKNOWN_APPROVAL
    run_id = start(fleet, ["p", "pay", {"payee": "acme", "amount": 1}])
    waiting(fleet, run_id)
    cancel = Envelope.new(EventType.RUN_CANCEL_REQUESTED, run_id, RunCancelRequested(reason="changed my mind"),
                          trace_id="t")
    fleet.runtime.publisher.publish([cancel])
    assert wait_for_run(fleet.store, run_id).state == RunState.CANCELLED
    assert fleet.store.pending_approvals(run_id=run_id) == []
    with pytest.raises(ApprovalRefused, match="has ended"):
        answer(fleet, run_id, "p")
    assert ledger(fleet, run_id) == []


def test_the_bundled_example_pauses_and_an_approval_resumes_it(fleet: EmbeddedFleet) -> None:
    # One embedded fleet per process: stopping a second would stop this module's (Celery's stop flag is global).
    import agentfleet.examples.refunds  # noqa: F401  (registers the agent with the running fleet)

    small = fleet.submit({"agent": "refunds", "input": {"order_id": "A-1", "amount_usd": 10}})
    assert wait_for_run(fleet.store, small).result["output"]["refunded_usd"] == 10  # type: ignore[index]
    big = fleet.submit({"agent": "refunds", "input": {"order_id": "A-2", "amount_usd": 80}})
    waiting(fleet, big)
    answer(fleet, big, "refund")
    assert wait_for_run(fleet.store, big).result["output"]["refunded_usd"] == 80  # type: ignore[index]
    ledger = fleet.workspace / "refunds" / "ledger.jsonl"  # type: ignore[attr-defined]
    assert [line.count("A-") for line in ledger.read_text().splitlines()] == [1, 1]


def test_the_cli_lists_answers_and_refuses_beside_an_embedded_fleet(fleet: EmbeddedFleet) -> None:
    import json

    from typer.testing import CliRunner

    from agentfleet.cli import app

    cli = CliRunner()
    run_id = start(fleet, ["p", "pay", {"payee": "acme", "amount": 3, "token": "t0ken"}])
    waiting(fleet, run_id)
    listed = cli.invoke(app, ["approvals", "--embedded", "--json", "--run", run_id])
    assert listed.exit_code == 0, listed.output
    [pending] = json.loads(listed.stdout)
    assert (pending["call_id"], pending["tool"], pending["shown"]["token"]) == ("p", "pay", "***")
    bad = cli.invoke(app, ["approve", run_id, "p", "--embedded", "--arguments", '{"payee": "acme"}', "--json"])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["error_code"] == ErrorCode.INVALID_ARGUMENTS
    ok = cli.invoke(app, ["approve", run_id, "p", "--embedded", "--as", "dave", "--note", "fine", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["decision"] == "approved"
    odd = cli.invoke(app, ["approve", "r\tx", "p", "--embedded"])
    assert odd.exit_code == 2 and "run_id" in odd.output, odd.output  # a usage error, not a traceback
    late = cli.invoke(app, ["deny", run_id, "p", "--embedded", "--reason", "too late", "--json"])
    assert late.exit_code == 1 and json.loads(late.stdout)["error_code"] == ErrorCode.APPROVAL_NOT_PENDING
    assert wait_for_run(fleet.store, run_id).result["status"] == "succeeded"  # type: ignore[index]
    status = cli.invoke(app, ["status", run_id, "--embedded", "--json"])
    [history] = json.loads(status.stdout)["approvals"]
    assert (history["status"], history["resolved_by"], history["note"]) == ("approved", "dave", "fine")
    traced = cli.invoke(app, ["trace", run_id, "--embedded"])  # the secret argument stays masked there too
    assert traced.exit_code == 0 and '"token":"***"' in traced.stdout and "t0ken" not in traced.stdout
    assert "approved by dave" in traced.stdout and "WAITING_APPROVAL → EXECUTING" in traced.stdout, traced.stdout


def test_a_run_left_waiting_past_its_deadline_is_ended_by_the_sweeper(fleet: EmbeddedFleet) -> None:
    from datetime import timedelta

    from agentfleet.loop.recovery import Action, waiting_within_deadline
    from agentfleet.roles.sweeper import sweep
    from agentfleet.store.records import now

    assert waiting_within_deadline(RunState.WAITING_APPROVAL, 100, 600, 120)
    assert not waiting_within_deadline(RunState.WAITING_APPROVAL, 721, 600, 120)
    assert not waiting_within_deadline(RunState.EXECUTING, 1, 600, 120)
    run_id = fleet.submit({"agent": "payer", "input": {"calls": [["p", "pay", {"payee": "x", "amount": 2}]]},
                           "limits": {"deadline_s": 5}})
    waiting(fleet, run_id)
    assert not sweep(fleet.runtime)  # waiting within its deadline: nothing to do
    findings = sweep(fleet.runtime, at=now() + timedelta(seconds=fleet.runtime.settings.stall_after_s + 60))
    assert [(f.run_id, f.action) for f in findings or []] == [(run_id, Action.EXPIRE)]
    result = wait_for_run(fleet.store, run_id).result
    assert result is not None and result["error_code"] == ErrorCode.DEADLINE
    with pytest.raises(ApprovalRefused, match="has ended"):
        answer(fleet, run_id, "p")


def test_an_approval_given_after_the_runs_deadline_is_refused_and_nothing_runs(fleet: EmbeddedFleet) -> None:
    """Containment 12: an approval given after the deadline was accepted and the payment ran (4/4)."""
    run_id = fleet.submit({"agent": "payer", "input": {"calls": [["p", "pay", {"payee": "x", "amount": 3}]]},
                           "limits": {"deadline_s": 5}})  # room to reach the wait on a busy machine
    waiting(fleet, run_id)
    time.sleep(max(0.0, 5.05 - fleet.store.get_run(run_id).elapsed_s()))  # type: ignore[union-attr]
    with pytest.raises(ApprovalRefused, match="passed its deadline") as late:
        answer(fleet, run_id, "p")
    assert late.value.code == ErrorCode.APPROVAL_NOT_PENDING
    assert fleet.store.pending_approvals(run_id=run_id) and ledger(fleet, run_id) == []


def test_an_answer_whose_event_could_not_be_published_is_sent_by_the_timer(
        fleet: EmbeddedFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = start(fleet, ["p", "pay", {"payee": "acme", "amount": 4}])
    waiting(fleet, run_id)
    publisher = fleet.runtime.publisher
    real = publisher.publish

    def broker_down(envelopes: Any) -> None:
        envelopes = list(envelopes)
        if any(e.type == EventType.APPROVAL_RESOLVED for e in envelopes):
            raise ConnectionError("broker away")
        real(envelopes)

    monkeypatch.setattr(publisher, "publish", broker_down)
    accepted = resolve(fleet.runtime, ApprovalResolve(run_id=run_id, call_id="p", decision="approve"), "ann")
    assert accepted.status == "accepted"  # recorded: the answer is not lost with the publish
    [record] = fleet.store.approvals_of(run_id)
    assert record.status == "approved" and record.sent_at is None and record.applied_at is None
    monkeypatch.setattr(publisher, "publish", real)
    result = wait_for_run(fleet.store, run_id).result
    assert result is not None and result["output"]["seen"] == [
        {"ok": True, "output": {"paid": "acme", "amount": 4}, "approval": {"by": "ann"}}]
    [record] = fleet.store.approvals_of(run_id)
    assert record.sent_at is not None and record.applied_at is not None
    assert [line.split(":")[:3] for line in ledger(fleet, run_id)] == [["pay", "acme", "4"]]


def test_an_answer_recorded_by_a_process_that_died_before_publishing_is_sent_soon(
        fleet: EmbeddedFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inbox consumer SIGKILLed between its commit and its publish: no except clause runs. The answer must
    not wait for the stall time (120 s) to be sent."""

    class Killed(BaseException):
        pass

    run_id = start(fleet, ["p", "pay", {"payee": "acme", "amount": 6}])
    waiting(fleet, run_id)
    publisher = fleet.runtime.publisher
    real = publisher.publish

    def dies(envelopes: Any) -> None:
        envelopes = list(envelopes)
        if any(e.type == EventType.APPROVAL_RESOLVED for e in envelopes):
            raise Killed
        real(envelopes)

    monkeypatch.setattr(publisher, "publish", dies)
    with pytest.raises(Killed):
        resolve(fleet.runtime, ApprovalResolve(run_id=run_id, call_id="p", decision="approve"), "ann")
    monkeypatch.setattr(publisher, "publish", real)
    assert fleet.runtime.settings.stall_after_s >= 60
    result = wait_for_run(fleet.store, run_id, timeout=30).result
    assert result is not None and result["status"] == "succeeded"
    assert [line.split(":")[:3] for line in ledger(fleet, run_id)] == [["pay", "acme", "6"]]


def test_an_agent_that_can_never_ask_costs_the_observer_no_look_for_parked_calls(fleet: EmbeddedFleet) -> None:
    from sqlalchemy import event

    from tests.fixtures.agents import ledger, payer

    assert payer.asks_approval and not ledger.asks_approval
    looks: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("SELECT approvals.call_id"):  # parked_calls (the timer reads whole rows)
            looks.append(statement)

    event.listen(fleet.store.engine, "before_cursor_execute", count)
    try:
        # six calls at once: five fan-in results come before the set is complete
        run_id = fleet.submit({"agent": "ledger", "input": {}, "goal_id": uuid.uuid4().hex})
        assert wait_for_run(fleet.store, run_id).state == RunState.SUCCEEDED
        assert looks == []
        run_id = start(fleet, ["a", "shell", {"command": "ls"}], ["b", "shell", {"command": "pwd"}])
        assert wait_for_run(fleet.store, run_id).state == RunState.SUCCEEDED
        assert looks  # an agent that may ask does look
    finally:
        event.remove(fleet.store.engine, "before_cursor_execute", count)


def test_a_delegation_a_person_approves_starts_its_child_with_the_edited_input(fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "careful_asker", "input": {"queries": ["private", "open"]},
                           "goal_id": uuid.uuid4().hex})
    waiting(fleet, run_id)
    assert [c.input for c in fleet.store.children(run_id)] == [{"q": "open"}]  # the unchecked one went at once
    answer(fleet, run_id, "d0", arguments={"agent": "lookup", "input": {"q": "edited"}})
    run = wait_for_run(fleet.store, run_id)
    assert run.state == RunState.SUCCEEDED, run.result
    children = fleet.store.children(run_id)
    assert sorted(c.input["q"] for c in children) == ["edited", "open"]
    seen = sorted(s["output"]["output"]["seen"][0] for s in run.result["output"]["seen"]  # type: ignore[index]
                  if s["output"].get("agent") == "lookup")
    assert seen == ["kb:edited", "kb:open"]
    # Each started with what was left of the parent's budget (and both spend from it, live).
    assert all(c.limits["max_tokens"] < run.limits["max_tokens"] for c in children), [c.limits for c in children]
