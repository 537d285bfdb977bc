"""What the inbox accepts: strict, bounded, and exactly what later steps can carry."""

from __future__ import annotations

import bz2
import json
import lzma
import zlib

import pytest
from kombu.compression import decompress

import agentfleet.examples.repo_report  # noqa: F401  (registers repo_report)
from agentfleet.agents.registry import registry
from agentfleet.errors import ErrorCode, GoalRejected
from agentfleet.events.wire import MessageTooLarge, WireError, install_bounded_decompression, loads_strict
from agentfleet.loop.decisions import schema_errors
from agentfleet.roles.admission import admit, check_conflict
from agentfleet.roles.retry import max_retries, retry_delay

GOOD = {"agent": "repo_report", "input": {"path": "."}}


class TestBoundedDecompression:
    @pytest.fixture(autouse=True)
    def _limit(self) -> None:
        install_bounded_decompression(64 * 1024)

    @pytest.mark.parametrize("codec,compress", [("application/x-gzip", zlib.compress), ("gzip", zlib.compress),
                                                ("application/x-bz2", bz2.compress), ("xz", lzma.compress)])
    def test_a_body_within_the_limit_decompresses_as_before(self, codec: str, compress: object) -> None:
        body = json.dumps(GOOD).encode()
        assert decompress(compress(body), codec) == body  # type: ignore[operator]

    @pytest.mark.parametrize("codec,compress", [("application/x-gzip", zlib.compress),
                                                ("application/x-bz2", bz2.compress), ("xz", lzma.compress)])
    def test_a_small_body_that_expands_past_the_limit_is_refused_without_expanding_it(
            self, codec: str, compress: object) -> None:
        bomb = compress(b"[" * (200 * 1024 * 1024))  # type: ignore[operator]
        assert len(bomb) < 1024 * 1024
        with pytest.raises(MessageTooLarge):
            decompress(bomb, codec)

    def test_a_body_that_does_not_decompress_is_a_wire_error(self) -> None:
        with pytest.raises(WireError):
            decompress(b"not zlib at all", "application/x-gzip")

    def test_an_unknown_codec_is_refused(self) -> None:
        with pytest.raises(KeyError):
            decompress(b"x", "application/x-made-up")


class TestStrictJson:
    @pytest.mark.parametrize("raw,why", [
        (b'{"a": NaN}', "NaN"), (b'{"a": Infinity}', "Infinity"), (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": 1e400}', "out of range"), (b"[" * 5000 + b"]" * 5000, "nested"),
        (b'{"a": "x\\u0000y"}', "NUL"), (b'{"\\u0000": 1}', "NUL"), (b'{"a": "\\ud800"}', "surrogate"),
        (b"\xff\xfe\x00", "not JSON"), (b'{"a": ' + b"1" * 5000 + b"}", "not JSON"),
    ])
    def test_what_later_steps_cannot_carry_is_refused_with_the_reason(self, raw: bytes, why: str) -> None:
        with pytest.raises(WireError, match=why):
            loads_strict(raw, max_depth=64)

    def test_depth_is_counted_for_objects_and_arrays_alike(self) -> None:
        assert loads_strict(b'{"a": [[[1]]]}', max_depth=4) == {"a": [[[1]]]}
        with pytest.raises(WireError, match="nested deeper than 3"):
            loads_strict(b'{"a": [[[1]]]}', max_depth=3)

    def test_a_declared_content_encoding_is_honoured(self) -> None:
        assert loads_strict('{"a": "é"}'.encode("latin-1"), max_depth=8, encoding="latin-1") == {"a": "é"}
        with pytest.raises(WireError, match="content_encoding"):
            loads_strict(b"{}", max_depth=8, encoding="no-such-codec")


class TestAdmission:
    @pytest.mark.parametrize("limits", [{"max_steps": 20000}, {"max_steps": 0}, {"max_cost_usd": 0},
                                        {"deadline_s": 1e300}, {"max_tokens": -1}, {"deadline_s": "soon"}])
    def test_limits_the_planner_would_refuse_are_refused_at_the_inbox(self, limits: dict) -> None:
        with pytest.raises(GoalRejected) as info:
            admit(registry, {**GOOD, "limits": limits})
        assert info.value.code == ErrorCode.MALFORMED_MESSAGE

    def test_infinity_in_a_python_goal_is_refused_too(self) -> None:
        with pytest.raises(GoalRejected):
            admit(registry, {**GOOD, "limits": {"deadline_s": float("inf")}})

    @pytest.mark.parametrize("goal_id", ["a\x00b", "line\nbreak", "x" * 201])
    def test_a_goal_id_that_cannot_be_stored_or_logged_is_refused(self, goal_id: str) -> None:
        with pytest.raises(GoalRejected) as info:
            admit(registry, {**GOOD, "goal_id": goal_id})
        assert info.value.code == ErrorCode.MALFORMED_MESSAGE

    @pytest.mark.parametrize("goal_id", ["delegation/some-run/ask0", "trigger/some-event/resolver"])
    def test_a_goal_id_in_the_fleets_own_namespaces_is_refused(self, goal_id: str) -> None:
        """Child and triggered runs' ids are derived from them: an outside goal there could take a child's
        run before its parent starts it, or pose as one on the public exchange."""
        with pytest.raises(GoalRejected) as info:
            admit(registry, {**GOOD, "goal_id": goal_id})
        assert info.value.code == ErrorCode.MALFORMED_MESSAGE and "reserved" in info.value.message

    def test_a_routing_key_for_another_agent_is_refused(self) -> None:
        with pytest.raises(GoalRejected):
            admit(registry, json.dumps(GOOD).encode(), "goal.other")

    def test_json_schema_formats_are_checked(self) -> None:
        schema = {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}
        assert schema_errors(schema, {"to": "not-an-email"})
        assert not schema_errors(schema, {"to": "someone@example.org"})

    def test_the_same_goal_id_with_another_input_is_a_conflict(self) -> None:
        from datetime import UTC, datetime

        from agentfleet.loop.states import RunState
        from agentfleet.store.records import RunRecord

        ts = datetime.now(UTC)
        run = RunRecord("r", "repo_report", "g", "t", RunState.PLANNING, 1, 0, {"path": "."}, {}, 0, 0, 0, 0.0,
                        None, None, ts, ts)
        check_conflict("g", {"path": "."}, run)  # the same goal again: no conflict
        check_conflict("g", {"path": "x"}, None)  # no run yet: no conflict
        with pytest.raises(GoalRejected) as info:
            check_conflict("g", {"path": "x"}, run)
        assert info.value.code == ErrorCode.GOAL_CONFLICT


class TestRetryPolicy:
    def test_the_shortest_delays_add_up_to_the_window(self) -> None:
        n = max_retries(15.0, 300.0)
        assert sum(min(15.0, 0.25 * 2**k) / 2 for k in range(n)) >= 300.0

    def test_delays_grow_then_stay_at_the_cap_with_jitter(self) -> None:
        assert 0.125 <= retry_delay(0, 15.0) <= 0.25
        assert all(7.5 <= retry_delay(20, 15.0) <= 15.0 for _ in range(50))
