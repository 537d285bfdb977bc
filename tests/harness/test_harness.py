from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

from agentfleet import ToolContext, ToolError, tool
from agentfleet.errors import ConfigurationError, ErrorCode
from agentfleet.harness import run_tool


def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=tmp_path.resolve())


@tool
def add(a: int, b: Annotated[int, Field(description="second addend")] = 2) -> dict:
    """Add two integers."""
    return {"sum": a + b}


def test_a_typed_function_becomes_a_tool_with_a_json_schema() -> None:
    assert add.name == "add" and add.description == "Add two integers."
    assert add.parameters["properties"]["a"] == {"title": "A", "type": "integer"}
    assert add.parameters["properties"]["b"]["description"] == "second addend"
    assert add.parameters["required"] == ["a"]


def test_the_tool_context_is_injected_and_never_shown_to_the_model(tmp_path: Path) -> None:
    @tool
    def where(ctx: ToolContext, name: str) -> dict:
        """Say where."""
        return {"key": ctx.idempotency_key, "name": name}

    assert "ctx" not in where.parameters["properties"]
    assert run_tool(where, {"name": "x"}, ctx(tmp_path), 5).output == {"key": "k", "name": "x"}


def test_a_tool_needs_a_description_and_annotations() -> None:
    with pytest.raises(ConfigurationError, match="description"):
        tool(lambda x: x)

    def untyped(x):  # type: ignore[no-untyped-def]
        """Untyped."""

    with pytest.raises(ConfigurationError, match="annotation"):
        tool(untyped)


def test_read_only_tools_are_idempotent() -> None:
    @tool(read_only=True)
    def look() -> dict:
        """Look."""
        return {}

    assert look.idempotent and look.read_only


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [({}, "a"), ({"a": "not a number"}, "a"), ({"a": 1, "c": 3}, "c")],
)
def test_invalid_arguments_are_a_structured_failure(tmp_path: Path, arguments: dict, problem: str) -> None:
    result = run_tool(add, arguments, ctx(tmp_path), 5)
    assert not result.ok and result.error_code == ErrorCode.INVALID_ARGUMENTS
    assert problem in (result.message or "") and result.hint


def test_a_hanging_tool_times_out(tmp_path: Path) -> None:
    @tool(timeout_s=0.1)
    def hang() -> dict:
        """Hang."""
        import time

        time.sleep(5)
        return {}

    result = run_tool(hang, {}, ctx(tmp_path), 30)
    assert result.error_code == ErrorCode.TIMEOUT and "0.1s" in (result.message or "")


def test_a_raising_tool_is_an_internal_failure_not_a_crash(tmp_path: Path) -> None:
    @tool
    def broken() -> dict:
        """Break."""
        raise KeyError("missing")

    result = run_tool(broken, {}, ctx(tmp_path), 5)
    assert result.error_code == ErrorCode.INTERNAL and "KeyError" in (result.message or "")


def test_a_tool_error_keeps_its_code_and_hint(tmp_path: Path) -> None:
    @tool
    def deny() -> dict:
        """Deny."""
        raise ToolError("no", code=ErrorCode.PERMISSION_DENIED, hint="ask")

    result = run_tool(deny, {}, ctx(tmp_path), 5)
    assert (result.error_code, result.message, result.hint) == (ErrorCode.PERMISSION_DENIED, "no", "ask")


def test_an_oversized_response_is_refused(tmp_path: Path) -> None:
    @tool(response_limit=100)
    def big() -> dict:
        """Big."""
        return {"x": "y" * 1000}

    assert run_tool(big, {}, ctx(tmp_path), 5).error_code == ErrorCode.RESPONSE_TOO_LARGE


def test_output_that_is_not_json_is_refused(tmp_path: Path) -> None:
    @tool
    def odd() -> object:
        """Odd."""
        return {"handle": object()}

    result = run_tool(odd, {}, ctx(tmp_path), 5)
    assert result.error_code == ErrorCode.INTERNAL and "non-JSON" in (result.message or "")


class TestWorkspace:
    def test_paths_inside_the_workspace_resolve(self, tmp_path: Path) -> None:
        (tmp_path / "a").mkdir()
        assert ctx(tmp_path).resolve("a") == (tmp_path / "a").resolve()
        assert ctx(tmp_path).resolve(".") == tmp_path.resolve()

    @pytest.mark.parametrize("path", ["..", "../etc/passwd", "/etc/passwd", "a/../../x"])
    def test_paths_that_escape_are_permission_denied(self, tmp_path: Path, path: str) -> None:
        with pytest.raises(ToolError) as err:
            ctx(tmp_path).resolve(path)
        assert err.value.code == ErrorCode.PERMISSION_DENIED

    def test_a_symlink_out_of_the_workspace_is_refused(self, tmp_path: Path) -> None:
        os.symlink("/etc", tmp_path / "link")
        with pytest.raises(ToolError):
            ctx(tmp_path).resolve("link/passwd")


class TestRepoReportTools:
    def test_tools_count_list_and_read_real_files(self, tmp_path: Path) -> None:
        from agentfleet.examples.repo_report.tools import count_lines, list_files, read_file

        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "a.py").write_text("one\ntwo\nthree\n")
        (tmp_path / "pkg" / "b.md").write_text("x\ny")
        (tmp_path / "pkg" / "__pycache__").mkdir()
        (tmp_path / "pkg" / "__pycache__" / "c.pyc").write_bytes(b"\0\0")
        c = ctx(tmp_path)
        counted = run_tool(count_lines, {"path": "pkg"}, c, 5).output
        assert counted["total_lines"] == 5 and counted["files"] == 2
        assert counted["by_extension"] == {".py": 3, ".md": 2}
        assert counted["largest"] == {"path": "pkg/a.py", "lines": 3}
        assert run_tool(list_files, {"path": "pkg"}, c, 5).output["files"] == ["pkg/a.py", "pkg/b.md"]
        assert run_tool(read_file, {"path": "pkg/a.py", "max_chars": 3}, c, 5).output["text"] == "one"
        assert run_tool(read_file, {"path": "nope"}, c, 5).error_code == ErrorCode.INVALID_ARGUMENTS
        assert run_tool(list_files, {"path": "../"}, c, 5).error_code == ErrorCode.PERMISSION_DENIED


class TestWorkspaceSwap:
    """A directory swapped with a link to outside the workspace, over and over, while tools read through it."""

    @pytest.fixture
    def swapping(self, tmp_path: Path):  # type: ignore[no-untyped-def]
        import ctypes
        import threading

        workspace, outside = tmp_path / "ws", tmp_path / "outside"
        (workspace / "d").mkdir(parents=True)
        outside.mkdir()
        (workspace / "d" / "f.txt").write_text("inside\n")
        (outside / "f.txt").write_text("OUTSIDE\n")
        (workspace / "link").symlink_to(outside, target_is_directory=True)
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        stop = threading.Event()

        def swap() -> None:
            a, b = str(workspace / "d").encode(), str(workspace / "link").encode()
            while not stop.is_set():
                libc.renameat2(at_fdcwd, a, at_fdcwd, b, rename_exchange)

        thread = threading.Thread(target=swap, daemon=True)
        thread.start()
        yield workspace
        stop.set()
        thread.join()

    def test_reading_by_descriptor_never_reaches_outside(self, swapping: Path) -> None:
        from agentfleet.tools.workspace import Workspace

        ws, seen = Workspace(swapping), set()
        for _ in range(3000):
            try:
                seen.add(ws.read_bytes("d/f.txt"))
            except ToolError as exc:
                seen.add(exc.code)
            try:
                seen.update(e.read_bytes() for e in ws.walk("d"))
            except (ToolError, OSError) as exc:
                seen.add(type(exc).__name__)
        assert b"OUTSIDE\n" not in seen and b"inside\n" in seen

    def test_checking_then_opening_by_name_does_reach_outside(self, swapping: Path) -> None:
        """The way it was done before (and why the descriptor walk exists): this leaks."""
        leaked = False
        for _ in range(100_000):  # it leaks within tens of tries here; stop at the first
            try:
                leaked = ctx(swapping).resolve("d/f.txt").read_bytes() == b"OUTSIDE\n"
            except (ToolError, OSError):
                continue
            if leaked:
                break
        assert leaked

    def test_the_repo_report_tools_read_only_inside(self, swapping: Path) -> None:
        from agentfleet.examples.repo_report.tools import count_lines, read_file

        c = ToolContext(run_id="r", call_id="c", idempotency_key="k", workspace=swapping)
        for _ in range(300):
            for t, args in ((read_file, {"path": "d/f.txt"}), (count_lines, {"path": "d"})):
                result = run_tool(t, args, c, 5.0)
                assert "OUTSIDE" not in json.dumps(result.model_dump(mode="json"))

    def test_a_link_is_refused_and_dot_dot_is_outside(self, tmp_path: Path) -> None:
        from agentfleet.tools.workspace import Workspace

        (tmp_path / "real.txt").write_text("x")
        (tmp_path / "alias.txt").symlink_to(tmp_path / "real.txt")
        os.mkfifo(tmp_path / "fifo")
        ws = Workspace(tmp_path)
        for path, code in (("alias.txt", ErrorCode.PERMISSION_DENIED), ("../etc/passwd", ErrorCode.PERMISSION_DENIED),
                           ("/etc/passwd", ErrorCode.PERMISSION_DENIED), ("nope", ErrorCode.INVALID_ARGUMENTS),
                           ("fifo", ErrorCode.INVALID_ARGUMENTS)):
            with pytest.raises(ToolError) as info:
                ws.read_bytes(path)
            assert info.value.code == code, path
        assert ws.read_bytes("real.txt") == b"x"


def test_a_tool_that_raises_is_logged_with_its_traceback_and_the_model_gets_only_the_result(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    @tool
    def explode(n: int) -> dict:
        """Fail."""
        raise RuntimeError(f"kaboom {n}")

    with caplog.at_level("ERROR", logger="agentfleet.harness.runner"):
        result = run_tool(explode, {"n": 7}, ctx(tmp_path), 5.0)
    assert result.error_code == ErrorCode.INTERNAL and "kaboom 7" in (result.message or "")
    assert "Traceback" not in json.dumps(result.for_model())
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info is not None and "kaboom 7" in str(record.exc_info[1])
    assert "in explode" in caplog.text  # the tool's own frame, not only the harness's
    assert (record.tool, record.run_id, record.call_id) == ("explode", "r", "c")  # type: ignore[attr-defined]
