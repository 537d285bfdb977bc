"""`agentfleet schema` prints every public contract a non-Python client needs, approvals included."""

from __future__ import annotations

import json

import jsonschema
from typer.testing import CliRunner

from agentfleet.cli import app


def test_schema_prints_the_approval_contracts_and_the_readme_example_fits_them() -> None:
    printed = CliRunner().invoke(app, ["schema"])
    assert printed.exit_code == 0, printed.output
    schemas = json.loads(printed.stdout)
    assert {"goal", "result", "approval.resolve", "approval.answer", "approval.requested|approval.resolved",
            "tool.health_changed"} <= set(schemas)
    resolve = schemas["approval.resolve"]
    jsonschema.validate({"run_id": "r", "call_id": "c", "decision": "approve", "note": "known vendor",
                         "arguments": {"payee": "acme", "amount_usd": 50}}, resolve)
    for bad in ({"run_id": "r", "call_id": "c", "decision": "maybe"}, {"run_id": "r", "decision": "deny"},
                {"run_id": "r", "call_id": "c", "decision": "deny", "extra": 1}):
        try:
            jsonschema.validate(bad, resolve)
        except jsonschema.ValidationError:
            continue
        raise AssertionError(f"accepted {bad}")
