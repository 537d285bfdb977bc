"""Subprocess tools: any executable, JSON in on stdin and out on stdout, each way it fails a code.

These run real processes under the real bubblewrap (installed by ``make test``); nothing is mocked.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agentfleet import ToolContext
from agentfleet.errors import ConfigurationError, ErrorCode
from agentfleet.harness import run_tool
from agentfleet.sandbox.bwrap import support
from agentfleet.sandbox.options import ResourceLimits, Sandbox
from agentfleet.tools.manifest import load_tool_manifest, subprocess_tool
from agentfleet.tools.tool import Tool
from tests.helpers import call_ctx, processes_with, require_sandbox

EXAMPLES = Path(__file__).resolve().parents[2] / "agentfleet" / "examples" / "polyglot" / "tools"


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    require_sandbox()


def ctx(tmp_path: Path, call_id: str = "c") -> ToolContext:
    return call_ctx(tmp_path, call_id)


def py(name: str, code: str, **options: Any) -> Tool:
    schema = options.pop("schema", {"type": "object", "properties": {}, "additionalProperties": True})
    return subprocess_tool(name, ["python3", "-c", code], description=f"{name} (test)", schema=schema, **options)


def test_a_subprocess_tool_reads_json_on_stdin_and_answers_json_on_stdout(tmp_path: Path) -> None:
    echo = py("echo", "import json,sys; a=json.load(sys.stdin); print(json.dumps({'got': a['text'][::-1]}))",
              schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                      "additionalProperties": False})
    assert echo.spec()["parameters"]["required"] == ["text"]
    result = run_tool(echo, {"text": "abc"}, ctx(tmp_path), 10)
    assert result.ok and result.output == {"got": "cba"}


def test_arguments_are_checked_against_the_declared_schema_before_anything_starts(tmp_path: Path) -> None:
    echo = py("echo", "raise SystemExit(3)", schema={"type": "object", "properties": {"n": {"type": "integer"}},
                                                     "additionalProperties": False})
    result = run_tool(echo, {"n": "five", "extra": 1}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.INVALID_ARGUMENTS and "n" in result.message


def test_a_non_zero_exit_is_a_failure_whose_message_is_the_tail_of_stderr(tmp_path: Path) -> None:
    failing = py("failing", "import sys; print('x' * 9000, file=sys.stderr); print('disk on fire', file=sys.stderr);"
                            " sys.exit(4)")
    result = run_tool(failing, {}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.INTERNAL
    assert "exited 4" in result.message and result.message.rstrip().endswith("disk on fire")
    assert len(result.message) < 2000


def test_a_tool_may_name_its_own_error_code(tmp_path: Path) -> None:
    picky = py("picky", "import json; print(json.dumps({'error': {'code': 'INVALID_ARGUMENTS', 'message': 'no such "
                        "city', 'hint': 'try Paris'}})); raise SystemExit(1)")
    result = run_tool(picky, {}, ctx(tmp_path), 10)
    assert (result.error_code, result.message, result.hint) == (ErrorCode.INVALID_ARGUMENTS, "no such city",
                                                                "try Paris")


def test_invalid_json_on_stdout_is_internal_with_the_head_of_what_it_printed(tmp_path: Path) -> None:
    chatty = py("chatty", "print('Hello! Here is your answer: 42' + 'z' * 5000)")
    result = run_tool(chatty, {}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.INTERNAL and "not JSON" in result.message
    assert "Hello! Here is your answer: 42" in result.message and len(result.message) < 1000


def test_five_mib_of_output_becomes_an_artifact_and_the_model_gets_its_head(tmp_path: Path) -> None:
    big = py("big", "import json; print(json.dumps({'rows': ['r%07d' % i for i in range(500000)]}))")
    result = run_tool(big, {}, ctx(tmp_path), 20)
    assert result.ok, result
    view = result.output
    assert view["size"] > 5_000_000 and view["artifact"].startswith("sha256:")
    assert view["head"].startswith('{"rows": ["r0000000"') and len(view["head"]) <= 2000
    assert "read_artifact" in view["note"]
    [payload] = result.payloads().items()
    assert payload[0] == view["artifact"] and len(payload[1]) == view["size"]


def test_output_over_the_hard_cap_is_response_too_large_and_not_kept(tmp_path: Path) -> None:
    flood = py("flood", "import sys\nwhile True: sys.stdout.write('y' * 65536)", max_output=1 << 20)
    result = run_tool(flood, {}, ctx(tmp_path), 20)
    assert result.error_code == ErrorCode.RESPONSE_TOO_LARGE and not result.payloads()


def test_a_tool_that_hangs_times_out_and_is_gone(tmp_path: Path) -> None:
    hang = py("hang", "import time; time.sleep(600)  # agentfleet-test-hang", timeout_s=1)
    started = time.monotonic()
    result = run_tool(hang, {}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.TIMEOUT and time.monotonic() - started < 10
    assert processes_with("agentfleet-test-hang") == []


def test_a_tool_that_ignores_sigterm_is_killed_anyway(tmp_path: Path) -> None:
    stubborn = py("stubborn", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                              "while True: time.sleep(0.05)  # agentfleet-test-stubborn", timeout_s=1)
    result = run_tool(stubborn, {}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.TIMEOUT
    assert processes_with("agentfleet-test-stubborn") == []


def test_cancellation_stops_the_tool_process(tmp_path: Path) -> None:
    flag = tmp_path / "cancelled"
    slow = py("slow", "import time; time.sleep(600)  # agentfleet-test-cancel", timeout_s=60)
    c = ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=tmp_path.resolve(),
                    cancel_check=flag.exists)
    import threading
    threading.Timer(0.5, flag.touch).start()
    result = run_tool(slow, {}, c, 60)
    assert result.error_code == ErrorCode.CANCELLED
    assert processes_with("agentfleet-test-cancel") == []


@pytest.mark.parametrize("language", ["python", "node", "bash"])
def test_the_shipped_examples_in_each_language_succeed_and_fail_with_codes(tmp_path: Path, language: str) -> None:
    tool = load_tool_manifest(EXAMPLES / f"word_count_{language}.tool.toml")
    ok = run_tool(tool, {"text": "one two  three\nfour"}, ctx(tmp_path), 10)
    assert ok.ok and ok.output == {"words": 4, "lines": 2, "language": language}, ok
    bad = run_tool(tool, {"text": ""}, ctx(tmp_path), 10)
    assert bad.error_code == ErrorCode.INVALID_ARGUMENTS and "empty" in bad.message, bad


# ----------------------------------------------------------------- escape attempts, each a test


def test_escape_a_tcp_connection_to_the_broker_is_refused(tmp_path: Path) -> None:
    probe = py("net", "import json, socket\ntry:\n socket.create_connection(('127.0.0.1', 5672), timeout=2)\n"
                      " print(json.dumps('connected'))\nexcept OSError as e:\n print(json.dumps(str(e)))")
    result = run_tool(probe, {}, ctx(tmp_path), 10)
    assert result.ok and result.output != "connected" and "refused" in result.output.lower()


def test_escape_writing_outside_the_work_directory_fails(tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    probe = py("write", f"import json\nout = {{}}\nfor p in ['{target}', '/usr/evil', '/etc/evil', '/tool_x', "
                        "'/sandbox/tool_x', '/sandbox/work/ok.txt']:\n try:\n  open(p, 'w').write('x'); "
                        "out[p] = 'written'\n except OSError as e:\n  out[p] = e.strerror\nprint(json.dumps(out))")
    result = run_tool(probe, {}, ctx(tmp_path), 10)
    assert result.ok and result.output["/sandbox/work/ok.txt"] == "written", result
    assert [p for p, v in result.output.items() if v == "written"] == ["/sandbox/work/ok.txt"]
    assert not target.exists()


def test_escape_reading_a_canary_file_in_the_workers_home_fails(tmp_path: Path) -> None:
    home = Path.home()
    canary = home / f".agentfleet-canary-{os.getpid()}"
    canary.write_text("CANARY-FILE-SECRET")
    try:
        probe = py("read", f"import json\ntry:\n print(json.dumps(open('{canary}').read()))\nexcept OSError as e:\n"
                           " print(json.dumps(e.strerror))")
        result = run_tool(probe, {}, ctx(tmp_path), 10)
        assert result.ok and "CANARY" not in json.dumps(result.output), result
    finally:
        canary.unlink()


def test_escape_reading_the_workers_environment_finds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv("AGENTFLEET_CANARY_SECRET", "CANARY-ENV-SECRET")
    probe = py("env", "import json, os\nprocs = {}\nimport glob\nfor f in glob.glob('/proc/*/environ'):\n try:\n"
                      "  procs[f] = open(f, 'rb').read().decode(errors='replace')\n except OSError:\n  pass\n"
                      "print(json.dumps({'env': dict(os.environ), 'procs': procs}))",
               sandbox=Sandbox(pass_env=("LANG_UNSET",), env={"GREETING": "hi"}))
    result = run_tool(probe, {}, ctx(tmp_path), 10)
    assert result.ok and "CANARY" not in json.dumps(result.output)
    assert result.output["env"]["GREETING"] == "hi" and result.output["env"]["HOME"] == "/sandbox/work"


def test_escape_a_fork_bomb_is_held_by_the_process_limit(tmp_path: Path) -> None:
    bomb = subprocess_tool("bomb", ["bash", "-c", "b() { b | b & }; b; sleep 30 # agentfleet-test-bomb"],
                           description="fork bomb", schema={"type": "object"}, timeout_s=3,
                           sandbox=Sandbox(limits=ResourceLimits(processes=32)))
    result = run_tool(bomb, {}, ctx(tmp_path), 10)
    assert not result.ok and result.error_code in (ErrorCode.RESOURCE_LIMIT, ErrorCode.TIMEOUT, ErrorCode.INTERNAL)
    time.sleep(0.2)
    assert processes_with("agentfleet-test-bomb") == []


def test_escape_allocating_two_gib_fails_inside_the_tool(tmp_path: Path) -> None:
    hog = py("hog", "b = bytearray(2 * 1024 ** 3); print(len(b))", sandbox=Sandbox(limits=ResourceLimits(
        memory_mb=512)))
    result = run_tool(hog, {}, ctx(tmp_path), 20)
    assert result.error_code == ErrorCode.INTERNAL and "MemoryError" in result.message


def test_escape_spinning_past_the_cpu_limit_is_stopped(tmp_path: Path) -> None:
    spin = py("spin", "while True: pass", timeout_s=30, sandbox=Sandbox(limits=ResourceLimits(cpu_s=1)))
    started = time.monotonic()
    result = run_tool(spin, {}, ctx(tmp_path), 30)
    assert result.error_code == ErrorCode.RESOURCE_LIMIT and "CPU" in result.message
    assert time.monotonic() - started < 20


def test_escape_a_grandchild_cannot_outlive_the_timeout(tmp_path: Path) -> None:
    sneaky = subprocess_tool("sneaky", ["bash", "-c", "setsid bash -c 'sleep 300; : agentfleet-test-grandchild' "
                                                      "& disown; sleep 300"],
                             description="leaves a grandchild", schema={"type": "object"}, timeout_s=1)
    result = run_tool(sneaky, {}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.TIMEOUT
    time.sleep(0.3)
    assert processes_with("agentfleet-test-grandchild") == []


def test_a_grandchild_left_behind_by_a_finished_tool_is_gone_too(tmp_path: Path) -> None:
    quick = subprocess_tool("quick", ["bash", "-c", "(setsid bash -c 'sleep 300; : agentfleet-test-left' &); "
                                                     "echo '{}'"],
                            description="leaves a grandchild and ends", schema={"type": "object"}, timeout_s=5)
    assert run_tool(quick, {}, ctx(tmp_path), 10).ok
    time.sleep(0.3)
    assert processes_with("agentfleet-test-left") == []


def test_the_work_directory_is_private_to_the_call_and_never_on_the_hosts_disk(tmp_path: Path) -> None:
    where = py("where", "import json, os; open('note-agentfleet-where', 'w').write('x'); "
                        "print(json.dumps([os.getcwd(), open('/proc/self/mountinfo').read()]))")
    result = run_tool(where, {}, ctx(tmp_path), 10)
    cwd, mounts = result.output
    assert cwd == "/sandbox/work" and any(" /sandbox/work " in m and " tmpfs " in m for m in mounts.splitlines())
    import subprocess
    found = subprocess.run(["find", "/tmp", "/var/tmp", "-name", "note-agentfleet-where"], capture_output=True,
                           text=True)
    assert found.stdout == ""


def test_a_kept_work_directory_becomes_an_artifact(tmp_path: Path) -> None:
    maker = py("maker", "open('report.txt', 'w').write('hello'); print('{}')", sandbox=Sandbox(keep_workdir=True))
    result = run_tool(maker, {}, ctx(tmp_path), 10)
    assert result.ok and result.output == {} and result.artifacts
    [(ref, tarball)] = result.payloads().items()  # a file: the tree never sits whole in the worker's memory
    import tarfile
    with tarfile.open(fileobj=tarball) as tar:
        assert tar.extractfile("./report.txt").read() == b"hello"  # type: ignore[union-attr]
    assert result.artifacts[0]["kind"] == "workdir" and result.artifacts[0]["ref"] == ref


def test_unknown_options_and_bad_schemas_are_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown option"):
        subprocess_tool("x", ["true"], description="x", schema={"type": "object"}, colour="red")
    with pytest.raises(ConfigurationError, match="JSON Schema"):
        subprocess_tool("x", ["true"], description="x", schema={"type": "objekt"})
    with pytest.raises(ConfigurationError, match="sandbox"):
        subprocess_tool("x", ["true"], description="x", schema={"type": "object"}, sandbox={"network": "maybe"})
    manifest = tmp_path / "bad.tool.toml"
    manifest.write_text('name = "bad"\ndescription = "d"\ncommand = ["true"]\nretries = 3\n')
    with pytest.raises(ConfigurationError, match=r"bad.tool.toml.*retries"):
        load_tool_manifest(manifest)


def test_where_bubblewrap_cannot_run_a_sandboxed_tool_is_refused_never_run_bare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    marker = tmp_path / "ran"
    bare = subprocess_tool("bare", ["/usr/bin/touch", str(marker)], description="d", schema={"type": "object"})
    assert not support(refresh=True).available
    result = run_tool(bare, {}, ctx(tmp_path), 10)
    assert result.error_code == ErrorCode.TOOL_UNAVAILABLE and "bubblewrap" in result.message
    assert not marker.exists()
    monkeypatch.undo()
    assert support().available  # found again as soon as bwrap is on the PATH


def test_a_python_tool_may_opt_in_to_run_as_a_subprocess_in_the_sandbox(tmp_path: Path) -> None:
    from tests.fixtures.sandboxed_tools import refuses, sleepy, where_am_i

    canary = Path.home() / f".agentfleet-canary-py-{os.getpid()}"
    canary.write_text("CANARY")
    try:
        result = run_tool(where_am_i, {"peek": str(canary)}, ctx(tmp_path, "py1"), 10)
    finally:
        canary.unlink()
    assert where_am_i.kind == "subprocess" and result.ok, result
    assert result.output["cwd"] == "/sandbox/work" and result.output["call"] == "py1"
    assert result.output["uid"] != 0
    assert result.output["peek"] != "CANARY"
    said = run_tool(refuses, {"city": "Atlantis"}, ctx(tmp_path), 10)
    assert (said.error_code, said.message, said.hint) == (ErrorCode.INVALID_ARGUMENTS, "no such city: Atlantis",
                                                          "Try Paris.")
    slow = run_tool(sleepy, {"seconds": 300}, ctx(tmp_path), 10)
    assert slow.error_code == ErrorCode.TIMEOUT
    assert processes_with("tests.fixtures.sandboxed_tools:sleepy") == []  # killed, not a thread left running


def test_a_sandboxed_python_tool_must_be_importable_by_the_sandbox() -> None:
    from agentfleet import tool as declare_tool

    def local(x: int) -> int:
        """Local."""
        return x

    with pytest.raises(ConfigurationError, match="module-level function"):
        declare_tool(sandbox=True)(local)


def test_the_private_tmp_is_bounded(tmp_path: Path) -> None:
    filler = py("filler", "import json\ntry:\n open('/tmp/fill', 'wb').write(b'x' * (8 << 20))\n"
                          " print(json.dumps('wrote'))\nexcept OSError as e:\n print(json.dumps(e.strerror))",
                sandbox=Sandbox(limits=ResourceLimits(tmp_mb=4)))
    result = run_tool(filler, {}, ctx(tmp_path), 10)
    assert result.ok and result.output == "No space left on device", result


# Domain events from a tool in any language: one JSON object per line, {"name": ..., "payload": {...}}, appended
# to the file $AGENTFLEET_EVENTS names; published once the call's step commits, as ctx.publish would.
def announcer(lines: str, **options: Any) -> Tool:
    return subprocess_tool("announce", ["bash", "-c", f"{lines}\necho '{{\"done\": true}}'"],
                           description="announce (test)", schema={"type": "object"}, **options)


def test_a_subprocess_tool_publishes_domain_events_through_its_events_file(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    tool = announcer("""echo '{"name": "file.counted", "payload": {"lines": 3}}' >> "$AGENTFLEET_EVENTS"
                        echo '{"name": "file.counted", "payload": {"lines": 4}}' >> "$AGENTFLEET_EVENTS" """)
    result = run_tool(tool, {}, c, 10)
    assert result.ok and result.output == {"done": True}, result
    assert c.published == [("file.counted", {"lines": 3}), ("file.counted", {"lines": 4})]


def test_a_sandboxed_python_tool_publishes_with_ctx_publish(tmp_path: Path) -> None:
    from tests.fixtures.sandboxed_tools import ship

    c = ctx(tmp_path)
    result = run_tool(ship, {"parcels": ["P1", "P2"]}, c, 10)
    assert result.ok and result.output == {"shipped": 2}, result
    assert c.published == [("parcel.shipped", {"parcel": "P1"}), ("parcel.shipped", {"parcel": "P2"})]
    refused = ctx(tmp_path)
    said = run_tool(ship, {"parcels": [""]}, refused, 10)  # the child checks the schema as the executor does
    assert said.error_code == ErrorCode.INVALID_ARGUMENTS and refused.published == []
    assert [name for name, _, _ in refused.refused] == ["parcel.shipped"]  # to be dead-lettered with the reason


def test_events_a_subprocess_tool_cannot_publish_fail_its_call_and_none_is_sent(tmp_path: Path) -> None:
    from tests.fixtures.sandboxed_tools import PARCEL_SHIPPED

    cases = {
        "off-schema": (f"""echo '{{"name": "{PARCEL_SHIPPED}", "payload": {{"parcel": ""}}}}' \
                           >> "$AGENTFLEET_EVENTS" """,
                       ErrorCode.INVALID_ARGUMENTS, "parcel"),
        "bad name": ("""echo '{"name": "Shouting.Name", "payload": {}}' >> "$AGENTFLEET_EVENTS" """,
                     ErrorCode.INVALID_ARGUMENTS, "not an event name"),
        "not JSON": ("""echo 'ok' >> "$AGENTFLEET_EVENTS" """, ErrorCode.INTERNAL, "line 1"),
        "no payload": ("""echo '{"name": "a.b"}' >> "$AGENTFLEET_EVENTS" """, ErrorCode.INTERNAL, "line 1"),
        "too many": ("""for i in $(seq 200); do echo '{"name": "a.b", "payload": {}}' >> "$AGENTFLEET_EVENTS"; done""",
                     ErrorCode.RESPONSE_TOO_LARGE, "events"),
        "too large": ("""head -c 2000000 /dev/zero | tr '\\0' 'x' >> "$AGENTFLEET_EVENTS" """,
                      ErrorCode.RESPONSE_TOO_LARGE, "events"),
    }
    for case, (lines, code, said) in cases.items():
        c = ctx(tmp_path)
        result = run_tool(announcer(lines), {}, c, 10)
        assert result.error_code == code and said in (result.message or ""), (case, result)
        assert c.published == [], case
        assert bool(c.refused) == (code == ErrorCode.INVALID_ARGUMENTS), case  # those are dead-lettered


def test_events_file_swapped_for_a_symlink_is_not_followed(tmp_path: Path) -> None:
    """The events "file" is a pipe the call inherits: there is no path on the host to swap for a link to a
    file of the worker's, and the executor never opens one."""
    canary = Path.home() / f".agentfleet-canary-events-{os.getpid()}"
    canary.write_text('{"name": "stolen.secret", "payload": {"secret": "CANARY"}}\n')
    try:
        c = ctx(tmp_path)
        result = run_tool(announcer(f'ln -sf {canary} "$AGENTFLEET_EVENTS"; ln -sf {canary} ev; '
                                    f'export AGENTFLEET_EVENTS=ev'), {}, c, 10)
    finally:
        canary.unlink()
    assert c.published == [] and "CANARY" not in json.dumps(result.model_dump())
