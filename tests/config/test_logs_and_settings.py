from __future__ import annotations

import json
import logging

import pytest

from agentfleet.config.settings import Settings
from agentfleet.logs import JsonFormatter, log_context, redact


def test_secrets_are_redacted_by_key_and_inside_urls() -> None:
    assert redact({"api_key": "sk-1", "nested": {"password": "p", "ok": 1}}) == {
        "api_key": "***", "nested": {"password": "***", "ok": 1}}
    assert redact("amqp://guest:hunter2@host//") == "amqp://guest:***@host//"


def test_log_lines_are_json_with_the_run_context() -> None:
    from agentfleet.logs import ContextFilter

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    with log_context(run_id="r1", trace_id="t1"):
        ContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "hello you" and line["run_id"] == "r1" and line["trace_id"] == "t1"


def test_settings_come_from_agentfleet_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLEET_NAMESPACE", "tenant1")
    monkeypatch.setenv("AGENTFLEET_AGENTS", "a.b, c.d")
    settings = Settings()
    assert settings.namespace == "tenant1" and settings.agent_modules == ["a.b", "c.d"]


def test_the_embedded_profile_swaps_only_the_transports() -> None:
    settings = Settings().with_profile("embedded")
    assert settings.effective_broker_url == "memory://"
    assert settings.effective_database_url.startswith("sqlite:///")
    assert Settings().effective_broker_url.startswith("amqp://")


def test_a_bad_namespace_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLEET_NAMESPACE", "has space")
    with pytest.raises(ValueError):
        Settings()
