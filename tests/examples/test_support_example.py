"""The support example end to end on the embedded fleet: an event triggers an agent that delegates in parallel."""

from __future__ import annotations

from pathlib import Path

from agentfleet.events.domain import trigger_goal_id
from agentfleet.loop.keys import run_id_for
from agentfleet.loop.states import RunState
from agentfleet.ops.trace import trace_lines, trace_of
from tests.helpers import embedded_fleet, eventually, wait_for_run


def test_triage_publishes_resolver_starts_and_delegates_two_lookups_in_one_trace(tmp_path: Path) -> None:
    with embedded_fleet(tmp_path, "agentfleet.examples.support") as fleet:
        triaged = wait_for_run(fleet.store, fleet.submit({"agent": "triage", "input": {
            "ticket_id": "T-100", "text": "I was charged twice for my invoice"}}))
        assert triaged.state == RunState.SUCCEEDED
        assert triaged.result["output"] == {"ticket_id": "T-100", "topic": "billing", "priority": "high"}  # type: ignore[index]
        [event] = eventually(lambda: fleet.store.domain_events(run_id=triaged.run_id), timeout=10)
        resolver_id = run_id_for("resolver", trigger_goal_id(event["event_id"], "resolver"))
        eventually(lambda: fleet.store.get_run(resolver_id), timeout=10)
        resolved = wait_for_run(fleet.store, resolver_id)
        assert resolved.state == RunState.SUCCEEDED, resolved.result
        output = resolved.result["output"]  # type: ignore[index]
        assert output["sources"][0]["id"] == "KB-1" and "refunded" in output["reply"]
        assert {a["id"] for a in output["related"]} == {"KB-1", "KB-2"}  # the billing articles
        children = fleet.store.children(resolver_id)
        # Cassettes played the models (no key, no network): the tree's tokens are theirs, counted in the root.
        assert {a.model.name for a in fleet.runtime.agents.all() if a.name in ("triage", "resolver", "kb_search")
                } == {"replay:support-triage-v1", "replay:support-resolver-v1", "replay:support-kb-search-v1"}
        assert resolved.input_tokens + resolved.output_tokens == 654 + 1355 + sum(
            c.input_tokens + c.output_tokens for c in children) and all(c.input_tokens == 799 for c in children)
        assert [c.agent for c in children] == ["kb_search", "kb_search"]
        trace = trace_of(fleet.store, triaged.run_id, fleet.runtime.agents)
        assert trace is not None
        text = "\n".join(trace_lines(trace))
    assert f"runs of trace {triaged.trace_id}" in text
    assert "resolver" in text and "← event ticket.triaged (run)" in text and "← delegate call ask0" in text


def test_an_outside_event_published_from_the_cli_starts_the_resolver_once_per_event_id(tmp_path: Path) -> None:
    """``agentfleet publish NAME --embedded``: what an outside system sends to the inbox, on one machine."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    def publish(payload: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentfleet.cli", "publish", "ticket.triaged", "--payload", payload,
             "--embedded", *extra], capture_output=True, text=True, cwd=ROOT, timeout=120,
            env={"PATH": "/usr/bin:/bin", "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/cli.db",
                 "PYTHONPATH": str(ROOT), "AGENTFLEET_AGENTS": "agentfleet.examples.support", "COLUMNS": "300"})

    ticket = json.dumps({"ticket_id": "T-7", "topic": "login", "priority": "normal",
                         "text": "I forgot my password"})
    shown = publish(ticket, "--id", "crm-42")
    assert shown.returncode == 0, shown.stderr
    assert "resolver" in shown.stdout and "← event ticket.triaged (external)" in shown.stdout, shown.stdout
    assert shown.stdout.count("kb_search") == 2
    again = publish(ticket, "--id", "crm-42", "--json")  # the same event id: it starts nothing new
    said = json.loads(again.stdout)
    assert again.returncode == 0 and said["name"] == "ticket.triaged" and said["new"] is False
    [run] = said["runs"]
    assert run["agent"] == "resolver" and run["status"] == "succeeded" and run["output"]["sources"][0]["id"] == "KB-3"
    refused = publish(json.dumps({"ticket_id": "T-8", "topic": "weather"}), "--json")
    assert refused.returncode == 1 and json.loads(refused.stdout)["error_code"] == "INPUT_INVALID", refused.stdout


def test_the_delegate_tool_tells_a_real_model_what_each_agent_takes() -> None:
    """A model sees only the tool's spec: without the child's goal schema it can only guess the input."""
    from agentfleet.agents.registry import load_agents

    agents = load_agents(["agentfleet.examples.support"])
    resolver = agents.get("resolver")
    assert resolver is not None
    [spec] = [s for s in resolver.tool_specs(list(resolver.tools)) if s["name"] == "delegate"]
    said = spec["description"]
    assert "kb_search" in said and "Search the knowledge base" in said  # what the agent does
    assert '"query"' in said and '"required": ["query"]' in said  # and the input it takes
