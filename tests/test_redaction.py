"""What is masked before anything leaves the fleet (harness/redaction.py), and the log lines it guards."""

from __future__ import annotations

import json
import logging

from agentfleet.config.settings import Settings
from agentfleet.logs import JsonFormatter
from agentfleet.redaction import Redactor, unmasked

CANARY = "canary-0d6f-s3cr3t"


def test_configured_values_and_credential_patterns_are_masked_in_text() -> None:
    r = Redactor([CANARY, "short", "abc"])  # 4-5 characters: whole words only; fewer: ignored
    cases = {
        f"saw {CANARY}!": "saw ***!",
        "amqp://guest:hunter22@rabbit:5672//": "amqp://guest:***@rabbit:5672//",
        "redis://:pw123456@127.0.0.1:6379/0": "redis://:***@127.0.0.1:6379/0",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig": "Authorization: *** ***",
        "sent Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig": "sent Bearer ***",
        "key sk-proj-AbCdEfGhIjKlMnOpQrSt1234 here": "key *** here",
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrSt": "***",
        "AKIAABCDEFGHIJKLMNOP": "***",
        "ghp_" + "a" * 36: "***",
        "xoxb-1234567890-abcdefghij": "***",
        "login password=hunter2 ok": "login password=*** ok",
        '{"api_key": "abc123"}': '{"api_key": "***"}',
        "a short word and input_tokens=30 max_tokens: 100": "a *** word and input_tokens=30 max_tokens: 100",
        "shorter words, abc and abcd": "shorter words, abc and abcd",
    }
    for given, shown in cases.items():
        assert r.text(given) == shown, given


def test_data_is_masked_by_name_at_any_depth_and_by_schema() -> None:
    r = Redactor([CANARY])
    data = {"input_tokens": 3, "token": "t", "nested": [{"Password": "p", "note": f"x{CANARY}"}], "pin": "1234"}
    assert r.data(data) == {"input_tokens": 3, "token": "***", "nested": [{"Password": "***", "note": "x***"}],
                            "pin": "1234"}
    schema = {"properties": {"pin": {"type": "string", "writeOnly": True}}}
    assert r.data(data, schema)["pin"] == "***"


def test_the_redactor_of_a_process_knows_its_service_passwords_and_secret_environment_values() -> None:
    settings = Settings(broker_url="amqp://u:broker-pw-1@h//", database_url="postgresql://u:db-pw-22@h/d",
                        redis_url="redis://:redis-pw-333@h/0", redact_values=f"{CANARY}, other-value-9")
    r = Redactor.from_settings(settings, environ={"OPENAI_API_KEY": "abcdef123456", "HOME": "/root/homedir"})
    assert set(r.values) == {CANARY, "other-value-9", "broker-pw-1", "db-pw-22", "redis-pw-333", "abcdef123456"}
    assert r.text("connect with abcdef123456 at /root/homedir") == "connect with *** at /root/homedir"


def test_a_log_line_masks_its_message_fields_and_traceback() -> None:
    from agentfleet import redaction

    before = redaction.active()
    redaction.install(Redactor([CANARY]))
    try:
        try:
            raise RuntimeError(f"refused key {CANARY}")
        except RuntimeError as exc:
            record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed with %s", (CANARY,), (
                type(exc), exc, exc.__traceback__))
        record.detail = {"api_key": "zzz", "url": "postgresql://u:pw9999@h/d"}
        line = JsonFormatter().format(record)
    finally:
        redaction.install(before)
    assert CANARY not in line and "pw9999" not in line and "zzz" not in line
    entry = json.loads(line)
    assert entry["msg"] == "failed with ***" and "RuntimeError: refused key ***" in entry["exc"]


def test_an_edit_keeps_a_masked_value_only_where_its_view_showed_it_masked() -> None:
    original = {"payee": "acme", "token": "s3cret", "nested": {"password": "pw-1"}, "items": [{"api_key": "k"}]}
    shown = {"payee": "acme", "token": "***", "nested": {"password": "***"}, "items": [{"api_key": "***"}]}
    assert unmasked({"payee": "globex", "token": "***", "nested": {"password": "***"},
                         "items": [{"api_key": "***"}]}, shown, original) == {
        "payee": "globex", "token": "s3cret", "nested": {"password": "pw-1"}, "items": [{"api_key": "k"}]}
    assert unmasked({"payee": "***", "token": "new"}, shown, original) == {"payee": "***", "token": "new"}
    assert unmasked({"extra": "***"}, shown, original) == {"extra": "***"}  # nothing to take it from
