from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentfleet import Message, ModelRequest, ReplayModel, ScriptedModel
from agentfleet.errors import ConfigurationError, ModelError


def request(iteration: int, goal: dict | None = None, seen: dict | None = None) -> ModelRequest:
    messages = [Message(role="tool", tool_call_id=k, content=json.dumps(v)) for k, v in (seen or {}).items()]
    return ModelRequest(run_id="r", agent="a", iteration=iteration, goal=goal or {}, messages=messages)


def cassette(tmp_path: Path, turns: list) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "m", "turns": turns}))
    return path


def test_replay_plays_the_turn_of_each_iteration(tmp_path: Path) -> None:
    model = ReplayModel(cassette(tmp_path, [
        {"tool_calls": [{"id": "a", "name": "t", "arguments": {"p": {"$goal": "/path"}}}],
         "usage": {"input_tokens": 5}},
        {"text": "done"},
    ]))
    first = model.complete(request(0, goal={"path": "src"}))
    assert first.tool_calls[0].arguments == {"p": "src"} and first.usage.input_tokens == 5
    assert first.model == "replay:m" and model.offline
    assert model.complete(request(1)).text == "done"


def test_replay_copies_values_from_earlier_tool_results(tmp_path: Path) -> None:
    model = ReplayModel(cassette(tmp_path, [{"tool_calls": [{"id": "f", "name": "final_answer", "arguments": {
        "n": {"$result": "a", "pointer": "/output/items/1"},
        "m": {"$result": "b", "pointer": "/output/x", "default": 0}}}]}]))
    turn = model.complete(request(0, seen={"a": {"ok": True, "output": {"items": [5, 7]}},
                                           "b": {"ok": False, "error_code": "TIMEOUT"}}))
    assert turn.tool_calls[0].arguments == {"n": 7, "m": 0}


def test_replay_reads_the_goal_with_a_default_for_what_it_lacks(tmp_path: Path) -> None:
    model = ReplayModel(cassette(tmp_path, [{"tool_calls": [{"id": "s", "name": "search", "arguments": {
        "query": {"$goal": "/query"}, "topic": {"$goal": "/topic", "default": None}}}]}]))
    assert model.complete(request(0, goal={"query": "q"})).tool_calls[0].arguments == {"query": "q", "topic": None}
    assert model.complete(request(0, goal={"query": "q", "topic": "t"})).tool_calls[0].arguments["topic"] == "t"
    with pytest.raises(ModelError, match="/query"):
        model.complete(request(0, goal={}))


def test_replay_past_the_recording_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="iteration 1"):
        ReplayModel(cassette(tmp_path, [{"text": "x"}])).complete(request(1))


def test_replay_referring_to_an_unseen_call_is_a_model_error(tmp_path: Path) -> None:
    model = ReplayModel(cassette(tmp_path, [{"tool_calls": [
        {"id": "x", "name": "t", "arguments": {"v": {"$result": "never"}}}]}]))
    with pytest.raises(ModelError, match="never"):
        model.complete(request(0))


def test_a_broken_cassette_is_a_configuration_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigurationError):
        ReplayModel(bad)


def test_the_bundled_cassette_loads() -> None:
    from agentfleet.examples.repo_report import repo_report

    assert len(repo_report.model.cassette.turns) == 3  # type: ignore[attr-defined]


def test_scripted_model_answers_by_iteration_and_may_read_the_request() -> None:
    model = ScriptedModel([ScriptedModel.calls(("t", {"x": 1})), lambda r: ScriptedModel.final({"i": r.iteration})])
    assert model.complete(request(0)).tool_calls[0].name == "t"
    assert model.complete(request(1)).tool_calls[0].arguments == {"i": 1}
    with pytest.raises(ModelError):
        model.complete(request(2))


def test_scripted_call_ids_are_unique_in_the_run() -> None:
    model = ScriptedModel([ScriptedModel.calls(("t", {}), ("t", {"x": 1}))] * 2)
    first, second = model.complete(request(0)), model.complete(request(1))
    ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert ids == ["i0-call0", "i0-call1", "i1-call0", "i1-call1"]
