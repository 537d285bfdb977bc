"""One redaction for all that leaves (issue "Containment", case 18): what the CLI prints, logs of every format,
and the shapes a secret takes on the way (short, JSON-escaped, non-ASCII, base64)."""

from __future__ import annotations

import base64
import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from agentfleet.config.settings import Settings
from agentfleet.redaction import RedactingStream, Redactor

ROOT = Path(__file__).resolve().parents[1]


def redactor(*values: str, **urls: str) -> Redactor:
    settings = Settings(redact_values=",".join(values), **urls)  # type: ignore[arg-type]
    return Redactor.from_settings(settings, environ={})


def test_a_short_service_password_is_masked_as_a_whole_word() -> None:
    """Was: passwords under 6 characters were never masked."""
    r = redactor(database_url="postgresql+psycopg://app:h7Kq@db:5432/app")
    assert r.text("login with h7Kq failed") == "login with *** failed"
    assert r.text("h7Kqx is another word") == "h7Kqx is another word"  # not inside other words


@pytest.mark.parametrize("secret", ['p"a\\ss-wörd-42', "Zürich-secret-9", "плохой-пароль"])
def test_a_secret_written_as_json_is_masked_in_every_escaping(secret: str) -> None:
    """Was: a secret JSON-escaped, or non-ASCII inside text, passed unmasked."""
    r = redactor(secret)
    for shown in (json.dumps({"v": secret}), json.dumps({"v": secret}, ensure_ascii=False), f"text {secret} text"):
        assert secret not in r.text(shown) and json.dumps(secret)[1:-1] not in r.text(shown), shown


def test_base64_of_a_secret_is_masked_at_any_alignment() -> None:
    """Was: the base64 of a secret passed unmasked (0/4)."""
    secret = "hunter2-correct-horse"
    r = redactor(secret)
    for prefix in ("", "x", "xy", "xyz"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            blob = encode(f"{prefix}{secret} and more".encode()).decode()
            masked = r.text(f"header: {blob}")
            assert "***" in masked, (prefix, blob)


def test_a_stream_masks_what_is_written_to_it_even_split_across_writes() -> None:
    buf = io.StringIO()
    stream = RedactingStream(buf, lambda: redactor("sekrit-value-77"))
    stream.write("the key is sekr")
    stream.write("it-value-77 and more\nnext line\n")
    stream.write("last sekrit-value-77")
    stream.flush()
    assert "sekrit" not in buf.getvalue() and buf.getvalue().count("***") == 2


def test_plain_text_logs_are_masked_too() -> None:
    """Was: AGENTFLEET_LOG_JSON=false turned masking off (3/3 canaries in a traceback)."""
    from agentfleet import logs
    from agentfleet.redaction import install

    install(redactor("canary-secret-123"))
    try:
        logs.configure("INFO", as_json=False)
        handler = logging.getLogger().handlers[0]
        buf = io.StringIO()
        handler.setStream(buf)  # type: ignore[attr-defined]
        try:
            raise RuntimeError("connect to postgresql://u:canary-secret-123@h/db failed")
        except RuntimeError:
            logging.getLogger("agentfleet.test").exception("boom canary-secret-123")
    finally:
        install(Redactor())
        logs.configure("INFO", as_json=True)
    assert "canary" not in buf.getvalue() and "***" in buf.getvalue()


def _cli(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "AGENTFLEET_PROFILE": "embedded",
            "AGENTFLEET_EMBEDDED_DATABASE_URL": f"sqlite:///{tmp_path}/cli.db", "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env={**base, **env})


def test_what_the_cli_prints_passes_the_same_redaction(tmp_path: Path) -> None:
    """Was: a plugin import error printed a key and the database password; run and status printed a tool error
    and a Result holding the key, unmasked."""
    plugin = tmp_path / "plugins" / "leaky"
    plugin.mkdir(parents=True)
    (plugin / "agentfleet-plugin.toml").write_text('name = "leaky"\nversion = "1.0"\nentry = "leaky_mod"\n')
    (plugin / "leaky_mod.py").write_text("import os\nraise RuntimeError('cannot reach ' + os.environ['SERVICE_TOKEN']"
                                         " + ' at ' + os.environ['AGENTFLEET_DATABASE_URL'])\n")
    env = {"SERVICE_TOKEN": "tok-canary-5f1e2d", "AGENTFLEET_PLUGIN_PATHS": str(tmp_path / "plugins"),
           "AGENTFLEET_DATABASE_URL": "postgresql+psycopg://app:pw-canary-77@127.0.0.1:1/app"}
    done = _cli("run", "repo_report", "--input", '{"path": "."}', tmp_path=tmp_path, **env)
    said = done.stdout + done.stderr
    assert "cannot reach" in said, said
    assert "canary" not in said, said


def test_a_secret_in_a_tool_error_is_masked_in_run_output(tmp_path: Path) -> None:
    (tmp_path / "agents_leak.py").write_text('''
import os
from agentfleet import Agent, ScriptedModel, ToolCall, tool

@tool
def connect() -> dict:
    """Connect."""
    raise RuntimeError("auth failed for " + os.environ["OPENAI_API_KEY"] + " pw " + os.environ["DB_PASSWORD"])

leak = Agent("leak", instructions="x", model=ScriptedModel([ScriptedModel.calls(("connect", {})),
             ScriptedModel.final({"note": "done sk-live-canary-0123456789abcdefXYZ"})]),
             goal_schema={"type": "object"}, result_schema={"type": "object"}, tools=[connect])
''')
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path}", "AGENTFLEET_AGENTS": "agents_leak",
           "OPENAI_API_KEY": "sk-canary-abcdefghijklmnop1234", "DB_PASSWORD": "dbpw-canary-99"}
    done = _cli("run", "leak", "--input", "{}", tmp_path=tmp_path, **env)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "auth failed" in said and "canary" not in said, said
    run_id = next(line.split()[1] for line in said.splitlines() if line.startswith("run "))
    shown = _cli("status", run_id, "--embedded", "--json", tmp_path=tmp_path, **env)
    assert shown.returncode == 0 and "canary" not in shown.stdout + shown.stderr



def test_a_crash_of_the_cli_prints_its_traceback_masked(tmp_path: Path) -> None:
    """An exception the CLI does not expect still ends in a traceback on stderr: it passes the redactor too (it was
    printed after the masking stream had been taken away)."""
    (tmp_path / "crashy_hook.py").write_text("import os\nraise RuntimeError('boom ' + os.environ['DB_PASSWORD'])\n")
    done = _cli("run", "repo_report", "--input", '{"path": "."}', tmp_path=tmp_path,
                PYTHONPATH=f"{ROOT}:{tmp_path}", AGENTFLEET_HOOKS="crashy_hook:hook", DB_PASSWORD="dbpw-canary-77")
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "boom" in said, said[-2000:]
    assert "canary" not in said, said[-2000:]
