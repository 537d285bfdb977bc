from __future__ import annotations

import array
import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfleet.constants import REPAIR_MESSAGE_NAME
from agentfleet.context import Assembled, ContextBudget, Heuristic, Overflow, Part, assemble, estimate_tokens
from agentfleet.context.budget import Budgets
from agentfleet.context.builder import goal_message, system_prompt
from agentfleet.context.compaction import turns_of
from agentfleet.context.counting import whole
from agentfleet.errors import ConfigurationError
from agentfleet.loop import Message, ToolCall
from agentfleet.loop.transcript import Derived, History, message_chars

TOOLS = [{"name": "t", "description": "a tool", "parameters": {"type": "object"}}]


def transcript(n: int, size: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", name="t", arguments={"i": i})]))
        out.append(Message(role="tool", tool_call_id=f"c{i}", content=json.dumps({"data": f"fact{i} " + "x" * size})))
    return out


def build(body: list[Message], window: int, goal: dict | None = None, constraints: tuple[str, ...] = (),
          **budget: object) -> Assembled | Overflow:
    budgets = ContextBudget(window=window, output_reserve=window // 8, **budget).resolve(None, None)  # type: ignore
    return assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                    task=[goal_message({"path": "."} if goal is None else goal)], constraints=list(constraints),
                    tools=TOOLS, transcript=body, budgets=budgets)


def test_instructions_then_goal_lead_and_constraints_end_the_system_prompt() -> None:
    built = build([], 10_000, constraints=("Budget left: 3 step(s).",))
    assert isinstance(built, Assembled)
    assert [m.role for m in built.messages] == ["system", "user"]
    system = built.messages[0].content or ""
    assert system.startswith("Be brief.") and system.endswith("Budget left: 3 step(s).")
    assert json.loads(built.messages[1].content or "") == {"goal": {"path": "."}}
    assert built.tokens[Part.TASK] > built.tokens[Part.OBSERVATIONS] == 0 and not built.compacted


def test_a_transcript_within_budget_is_kept_whole() -> None:
    body = transcript(3, 100)
    built = build(body, 100_000)
    assert isinstance(built, Assembled) and built.messages[2:] == body and not built.compacted


def test_over_budget_old_tool_results_are_compacted_first_to_a_reference_and_a_head() -> None:
    body = transcript(5, 4000)
    built = build(body, 8000)
    assert isinstance(built, Assembled) and built.compacted.get("results")
    results = [m for m in built.messages if m.role == "tool"]
    first = json.loads(results[0].content or "")
    assert first["compacted"] is True and first["ref"] == "result:c0" and first["head"].startswith('{"data": "fact0')
    assert results[-1] == body[-1]  # the latest observation is never compacted
    assert whole(built.estimated) <= built.budgets.prompt


def test_then_old_turns_become_lines_of_a_summary_that_keeps_the_first_and_latest() -> None:
    body = transcript(60, 4000)
    built = build(body, 4096)
    assert isinstance(built, Assembled) and built.compacted["turns"] > 0 and built.compacted.get("omitted")
    summary = next(m.content or "" for m in built.messages if m.role == "system" and "Earlier in this run" in
                   (m.content or ""))
    assert "turn 1: t(" in summary and "result:c0" in summary and "fact0" in summary  # what was set out first
    assert "omitted" in summary
    assert built.messages[-2:] == body[-2:]
    assert whole(built.estimated) <= built.budgets.prompt


def test_a_core_part_over_its_budget_ends_with_the_part_named() -> None:
    built = build([], 4096, goal={"text": "y" * 20_000})
    assert isinstance(built, Overflow) and built.part == Part.TASK
    assert "the task (goal and constraints)" in built.message and "window 4096" in built.message
    latest = [Message(role="assistant", tool_calls=[ToolCall(id="a", name="t")]),
              Message(role="tool", tool_call_id="a", content="z" * 20_000)]
    built = build(latest, 4096)
    assert isinstance(built, Overflow) and built.part == Part.OBSERVATIONS


def test_an_agent_sets_a_parts_budget_in_tokens_and_unknown_parts_are_refused() -> None:
    built = build([], 100_000, goal={"text": "y" * 3000}, parts={"task": 500})
    assert isinstance(built, Overflow) and built.part == Part.TASK and built.budget == 500
    with pytest.raises(ConfigurationError, match="unknown part 'memory'"):
        ContextBudget(parts={"memory": 10})
    with pytest.raises(ConfigurationError):
        ContextBudget(shares={"summary": 1.5})


def test_the_window_defaults_from_the_model_and_the_reserve_from_its_output_cap() -> None:
    budgets = ContextBudget().resolve(8192, 384)
    assert (budgets.window, budgets.reserve, budgets.prompt) == (8192, 384, 7808)
    assert ContextBudget().resolve(None, None).window == 128_000
    assert ContextBudget().resolve(4096, None).reserve == 512  # an eighth of the window


def test_building_context_does_not_change_the_transcript() -> None:
    body = transcript(40, 4000)
    before = [m.model_copy(deep=True) for m in body]
    build(body, 4096)
    assert body == before


def test_an_exact_count_over_the_estimate_scales_the_heuristic_up_never_down() -> None:
    h = Heuristic()
    assert h.scaled(100.0, 80) is h
    bigger = h.scaled(100.0, 150)
    assert bigger.scale == pytest.approx(1.5 * 1.03)
    assert bigger.chars(300) > h.chars(300)


def test_assembling_a_thousand_message_history_takes_milliseconds() -> None:
    """Not a timing assertion on the machine's speed: a guard against a quadratic pass, with a bound 50x the
    measured figure (benchmarks/README.md, "Context assembly")."""
    body = transcript(500, 2000)
    started = time.perf_counter()
    built = build(body, 4096)
    assert isinstance(built, Assembled) and time.perf_counter() - started < 2.0


# -- properties -------------------------------------------------------------------------------------------------------

_texts = st.text(st.characters(blacklist_categories=["Cs"]), max_size=400)
_turn = st.tuples(st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=6), _texts), min_size=0, max_size=3),
                  st.none() | _texts, st.booleans())


def _history(turns: list[tuple[list[tuple[str, str]], str | None, bool]]) -> list[Message]:
    out: list[Message] = []
    for n, (calls, text, repaired) in enumerate(turns):
        ids = [f"{n}-{cid}-{k}" for k, (cid, _) in enumerate(calls)]
        out.append(Message(role="assistant", content=text,
                           tool_calls=[ToolCall(id=i, name="t", arguments={"q": c}) for i, (c, _) in zip(ids, calls,
                                                                                                       strict=True)]))
        out += [Message(role="tool", tool_call_id=i, content=r) for i, (_, r) in zip(ids, calls, strict=True)]
        if repaired:
            out.append(Message(role="user", name=REPAIR_MESSAGE_NAME, content="try again"))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(_turn, max_size=30), st.integers(min_value=600, max_value=20_000), st.dictionaries(
    st.sampled_from(["x", "y"]), _texts, max_size=2))
def test_the_context_never_exceeds_its_budget_keeps_the_task_and_latest_turn_and_is_deterministic(
        turns: list, window: int, goal: dict) -> None:
    body = _history(turns)
    first, again = build(body, window, goal=goal), build(list(body), window, goal=goal)
    assert first == again  # deterministic: a redelivered plan step or a replay sees the same context
    if isinstance(first, Overflow):
        assert first.part in (Part.INSTRUCTIONS, Part.TOOLS, Part.TASK, Part.OBSERVATIONS)
        return
    counted = Heuristic().messages(first.messages) + Heuristic().tools(TOOLS)
    assert counted <= first.budgets.prompt + 1e-6
    assert goal_message(goal) in first.messages
    latest = list(turns_of(body)[-1].messages) if body else []
    assert first.messages[len(first.messages) - len(latest):] == latest


_messages = st.lists(st.builds(
    Message,
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    content=st.none() | _texts,
    tool_calls=st.lists(st.builds(ToolCall, id=st.text("abc", min_size=1, max_size=4), name=st.just("t"),
                                  arguments=st.dictionaries(st.text("xyz", max_size=3), st.integers() | _texts,
                                                            max_size=3)), max_size=2),
    tool_call_id=st.none() | st.text("abc", max_size=4),
    name=st.none() | st.sampled_from(["t", REPAIR_MESSAGE_NAME]),
), max_size=12)


@settings(deadline=None)
@given(_messages, _messages, st.integers(min_value=600, max_value=4000))
def test_a_history_kept_message_by_message_builds_the_prompt_a_whole_transcript_would(
        first: list[Message], then: list[Message], window: int) -> None:
    kept = History.of(first).plus(then)
    whole_list = [*first, *then]
    assert kept.messages == whole_list
    assert kept.repairs == sum(1 for m in whole_list if m.role == "user" and m.name == REPAIR_MESSAGE_NAME)
    assert kept.chars == sum(map(message_chars, whole_list))
    budgets = ContextBudget(window=window).resolve(None, None)
    common = dict(instructions=[Message(role="system", content="i")], task=[goal_message({"g": 1})],
                  constraints=["n"], tools=TOOLS, budgets=budgets)
    assert (assemble(transcript=kept.messages, transcript_chars=kept.chars, **common)  # type: ignore[arg-type]
            == assemble(transcript=whole_list, **common))  # type: ignore[arg-type]


def test_the_rate_limits_estimate_is_the_context_heuristics() -> None:
    body = transcript(3, 100)
    assert estimate_tokens(body) == whole(Heuristic().messages(body))


def test_a_models_summary_of_the_first_turns_stands_before_the_lines_of_the_later_ones() -> None:
    body = transcript(60, 4000)
    budgets = ContextBudget(window=4096, output_reserve=512).resolve(None, None)
    common = dict(instructions=[Message(role="system", content="i")], task=[goal_message({})], constraints=[],
                  tools=TOOLS, transcript=body, budgets=budgets)
    plain = assemble(**common)  # type: ignore[arg-type]
    assert isinstance(plain, Assembled)
    folded = plain.compacted["turns"]
    built = assemble(**common, summarized=(folded - 2, "the facts: fact0"))  # type: ignore[arg-type]
    assert isinstance(built, Assembled) and built.compacted["summarized"] == folded - 2
    summary = next(m.content or "" for m in built.messages if "Earlier in this run" in (m.content or ""))
    assert summary.splitlines()[1] == "the facts: fact0" and f"turn {folded - 1}:" in summary
    assert "turn 1:" not in summary
    too_big = assemble(**common, summarized=(folded, "x" * 50_000))  # type: ignore[arg-type]
    assert isinstance(too_big, Assembled) and "summarized" not in too_big.compacted  # the lines stand in
    ahead = assemble(**common, summarized=(folded + 5, "covers turns not folded yet"))  # type: ignore[arg-type]
    assert isinstance(ahead, Assembled) and "summarized" not in ahead.compacted


# -- what compaction costs as a run grows -----------------------------------------------------------------------------

# The hash of the prompts ``_compaction_cases`` assemble to, as the assembly of 55e00ed gave them (8 overflows, 31
# compacted: results, lines, omitted lines and a model's summary all among them).
GOLDEN_COMPACTION = "72f2e59ab66582e708cf831dfa29dadffae423fae46440ee2742b594b45f1059"

def _long_run(n: int, seed: int) -> list[Message]:
    """A run of ``n`` turns as real ones come: results small and large, words now and then, a repair note."""
    rng = random.Random(seed)
    out: list[Message] = []
    for i in range(n):
        calls = [ToolCall(id=f"i{i}-c{k}", name=rng.choice(["t", "read"]),
                          arguments={"i": i, "q": "x" * rng.randint(0, 120)})
                 for k in range(rng.choice([0, 1, 1, 1, 2]))]
        said = rng.choice([None, None, f"thinking about {i} " * rng.randint(1, 12)])
        out.append(Message(role="assistant", content=said, tool_calls=calls))
        out += [Message(role="tool", tool_call_id=c.id, content=json.dumps({"fact": i, "data": "y" * rng.choice(
            [5, 100, 239, 241, 600, 4000])})) for c in calls]
        if rng.random() < 0.05:
            out.append(Message(role="user", name=REPAIR_MESSAGE_NAME, content="try again"))
    return out


def _compaction_cases() -> list[tuple[list[Message], Budgets, Heuristic, tuple[int, str] | None]]:
    rng = random.Random(23)
    cases = []
    for seed in range(48):
        body = _long_run(rng.choice([3, 40, 150, 400]), seed)
        window = rng.choice([1024, 2048, 4096, 8192, 32_768])
        budgets = ContextBudget(window=window, output_reserve=window // 8).resolve(None, None)
        count = Heuristic().scaled(100.0, rng.choice([80, 100, 113, 150, 171]))
        summarized = rng.choice([None, None, (rng.randint(1, 30), "What a model made of the first turns.")])
        cases.append((body, budgets, count, summarized))
    return cases


def _assembled(body: list[Message], budgets: Budgets, count: Heuristic, summarized: tuple[int, str] | None,
               chars: int | None = None, derived: Derived | None = None) -> Assembled | Overflow:
    return assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                    task=[goal_message({"path": "."})], constraints=["2 steps left"], tools=TOOLS, transcript=body,
                    budgets=budgets, counter=count, transcript_chars=chars, summarized=summarized, derived=derived)


def test_compaction_assembles_exactly_what_it_did_before_it_was_made_cheaper_warm_or_cold() -> None:
    """A strict replay, or a redelivered plan step, must see the context the model saw, whichever version of the
    fleet assembles it: the prompts of 48 varied long runs (windows, scales, a model's summary) hash to what the
    assembly before its memos (55e00ed) gave, on a first assembly and on a second with everything remembered."""
    import hashlib

    def digest() -> str:
        seen = []
        for body, budgets, count, summarized in _compaction_cases():
            built = _assembled(body, budgets, count, summarized)
            again = _assembled(body, budgets, count, summarized, History.of(body).chars)
            assert again == built
            seen.append(built.message if isinstance(built, Overflow) else
                        [[m.model_dump(mode="json") for m in built.messages], built.tokens, built.compacted,
                         repr(built.estimated)])
        return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()

    assert digest() == digest() == GOLDEN_COMPACTION


def test_a_plan_past_the_window_sizes_and_lines_only_what_is_new_since_the_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a transcript no longer fits, every older turn was sized again and written again as a line on every plan:
    13.9 ms of CPU a plan at 800 turns in an 8k window, growing with the run (benchmarks/README.md). What a message
    weighs is remembered with the message, and its compacted form and a turn's line with the run's ``History`` (its
    index, context/older.py), so the next plan of a run grown by a turn sizes and writes only what is new (the prompt
    is the same, pinned above)."""
    from agentfleet.context import compaction
    from agentfleet.loop import transcript as messages

    body = _long_run(400, 7)
    budgets = ContextBudget(window=4096, output_reserve=512).resolve(None, None)
    history = History.of(body)
    first = _assembled(history.messages, budgets, Heuristic(), None, history.chars, history.derived)
    assert isinstance(first, Assembled) and first.compacted.get("turns", 0) > 100
    grown = history.plus(_long_run(401, 7)[len(body):])  # one turn more, as the next plan sees it
    sized: list[Message] = []
    lined: list[object] = []
    chars, line = messages._chars, compaction._line
    monkeypatch.setattr(messages.message_chars, "_make", lambda m: (sized.append(m), chars(m))[1])
    monkeypatch.setattr(compaction, "_line", lambda t: (lined.append(t), line(t))[1])
    again = _assembled(grown.messages, budgets, Heuristic(), None, grown.chars, grown.derived)  # as the planner does
    assert isinstance(again, Assembled)
    assert len(sized) <= 10 and len(lined) <= 3, (len(sized), len(lined))


@pytest.mark.parametrize("window", [4096, 32_768])
def test_a_plan_past_the_window_costs_the_same_at_turn_1600_as_at_turn_400(window: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Remembering what each older message weighs still walked every older turn on every plan: ~3 µs a turn, a plan
    at turn 3,000 costing 15 times one at turn 200 (benchmarks/README.md). The older turns are indexed with the run's
    ``History`` as it grows (context/older.py), and the fold points found by halving: a plan of a run grown by a turn
    looks up as many remembered values at turn 1,600 as at turn 400."""
    from agentfleet.loop.transcript import IdentityMemo

    budgets = ContextBudget(window=window, output_reserve=window // 8).resolve(None, None)
    body = _long_run(1601, 11)

    def lookups(n: int) -> int:
        start = len(_long_run(n, 11))
        history = History.of(body[:start])
        assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                 task=[goal_message({"path": "."})], constraints=["2 steps left"], tools=TOOLS,
                 transcript=history.messages, budgets=budgets, transcript_chars=history.chars,
                 derived=history.derived)
        grown = history.plus(body[start:len(_long_run(n + 1, 11))])
        counted = [0]
        get = IdentityMemo.get
        monkeypatch.setattr(IdentityMemo, "get", lambda self, obj: (counted.__setitem__(0, counted[0] + 1),
                                                                    get(self, obj))[1])
        built = assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                         task=[goal_message({"path": "."})], constraints=["2 steps left"], tools=TOOLS,
                         transcript=grown.messages, budgets=budgets, transcript_chars=grown.chars,
                         derived=grown.derived)
        monkeypatch.setattr(IdentityMemo, "get", get)
        assert isinstance(built, Assembled) and built.compacted.get("turns", 0) > 200
        assert grown.derived.value.exact_for(Heuristic())  # the folds found by halving
        assert built == _assembled(grown.messages, budgets, Heuristic(), None)  # the same prompt, indexed or not
        return counted[0]

    early, late = lookups(400), lookups(1600)
    assert late <= early * 1.1 + 20, (early, late)


_TEXT = st.text(alphabet=st.sampled_from(['a', ' ', '"', '\\', 'é', '\n', '\u2028', '{']), max_size=700)


@st.composite
def _runs(draw: st.DrawFn) -> list[list[Message]]:
    """Turns as a hostile model and hostile tools would make them: quotes and backslashes that escape twice in a line,
    results just over and far over what compacting keeps, repair notes, turns with no calls; cut where plans fall."""
    turns = []
    for i in range(draw(st.integers(1, 60))):
        calls = [ToolCall(id=f"c{i}-{k}", name="t", arguments={"q": draw(_TEXT)})
                 for k in range(draw(st.integers(0, 2)))]
        turn = [Message(role="assistant", content=draw(st.none() | _TEXT), tool_calls=calls)]
        turn += [Message(role="tool", tool_call_id=c.id, content=draw(_TEXT)) for c in calls]
        if draw(st.booleans()) and draw(st.booleans()):
            turn.append(Message(role="user", name=REPAIR_MESSAGE_NAME, content=draw(_TEXT)))
        turns.append(turn)
    return turns


@settings(max_examples=80, deadline=None)
@given(_runs(), st.sampled_from([256, 512, 1024, 4096]), st.lists(st.integers(1, 8), min_size=1, max_size=6),
       st.none() | st.tuples(st.integers(1, 20), st.just("What a model made of the first turns.")))
def test_folds_found_by_halving_are_the_folds_found_by_walking_the_turns(
        turns: list[list[Message]], window: int, steps: list[int], summarized: tuple[int, str] | None) -> None:
    """Halving over the index's sums decides only where that is exact (the default heuristic, no turn made heavier by
    compacting, no line heavier than its turn); everywhere, a history grown plan by plan (and a sibling grown from the
    same one, which must not see its turns) assembles what walking every turn assembles."""
    from unittest import mock

    from agentfleet.context.older import Index

    budgets = ContextBudget(window=window, output_reserve=window // 8).resolve(None, None)

    def built(history: History, walked: bool = False) -> Assembled | Overflow:
        with mock.patch.object(Index, "exact_for", lambda self, count: False) if walked else mock.MagicMock():
            return assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                            task=[goal_message({"path": "."})], constraints=["2 steps left"], tools=TOOLS,
                            transcript=history.messages, budgets=budgets, transcript_chars=history.chars,
                            summarized=summarized, derived=history.derived if not walked else None)

    history, at = History(), 0
    for step in steps:
        parent = history
        history = parent.plus(m for turn in turns[at:at + step] for m in turn)
        sibling = parent.plus(m for turn in turns[at + step:at + 2 * step] for m in turn)
        at += step
        for grown in (history, sibling):
            assert built(grown) == built(grown, walked=True)


def test_a_result_compacting_makes_heavier_sends_its_run_back_to_the_walk() -> None:
    """241 quotes are 482 characters as a message's JSON and 640 compacted (the head is escaped twice): compacting that
    turn makes the prompt larger again, so "fits with i turns compacted" is no longer monotone and halving would stop
    at a different turn than the walk (window 1970 here: 16 turns compacted and 2 folded instead of 1 compacted). The
    index marks such a turn, and its run is walked."""
    from agentfleet.context.compaction import latest_turn_at
    from agentfleet.context.older import index

    def turn(i: int, result: str) -> list[Message]:
        call = ToolCall(id=f"c{i}", name="t", arguments={})
        return [Message(role="assistant", tool_calls=[call]),
                Message(role="tool", tool_call_id=call.id, content=result)]

    body = [*turn(0, "a" * 3000), *turn(1, '"' * 241), *[m for i in range(2, 17) for m in turn(i, "ok")]]
    history = History.of(body)
    built = assemble(instructions=[Message(role="system", content=system_prompt("Be brief."))],
                     task=[goal_message({"p": 1})], constraints=[], tools=TOOLS, transcript=history.messages,
                     budgets=ContextBudget(window=1970, output_reserve=64).resolve(None, None),
                     transcript_chars=history.chars, derived=history.derived)
    assert isinstance(built, Assembled) and built.compacted == {"results": 1}
    assert not index(body, latest_turn_at(body)).exact_for(Heuristic())


class _Yielding(array.array):  # type: ignore[type-arg]
    def append(self, value: int) -> None:
        time.sleep(0.0005)
        super().append(value)


def test_histories_grown_from_one_history_in_threads_each_index_their_own_turns() -> None:
    """A planner's threads may plan two deliveries of one run at once (a redelivery beside the first), each from a
    history grown from the one the process keeps: the index they share is extended by one of them and copied by the
    other, never appended to by both."""
    import threading

    from agentfleet.context.compaction import latest_turn_at
    from agentfleet.context.older import index

    body = _long_run(60, 5)
    grown = [_long_run(61 + k, 5 + k)[len(body):] for k in range(6)]  # a different next turn or few for each
    for _ in range(10):
        base = History.of(body[: len(_long_run(40, 5))])
        base.derived.value = index(base.messages, latest_turn_at(base.messages))
        columns = base.derived.value.columns
        columns.starts = _Yielding("q", columns.starts)  # a thread between its check and its append lets others in
        children = [base.plus([*body[len(base.messages):], *more]) for more in grown]
        got: list[object] = [None] * len(children)

        def plan(child: History, got: list[object], k: int) -> None:
            got[k] = index(child.messages, latest_turn_at(child.messages), child.derived.value)

        threads = [threading.Thread(target=plan, args=(c, got, k)) for k, c in enumerate(children)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for child, view in zip(children, got, strict=True):
            fresh = index(child.messages, latest_turn_at(child.messages))
            assert view.turns == fresh.turns and view.through == fresh.through  # type: ignore[attr-defined]
            for name in ("starts", "chars", "compacted", "messages", "results", "lines", "odd"):
                mine = getattr(view.columns, name)[: view.turns + 1]  # type: ignore[attr-defined]
                assert mine == getattr(fresh.columns, name), name
            assert view.columns.text[: view.turns] == fresh.columns.text  # type: ignore[attr-defined]
            assert view.columns.smaller[: view.through] == fresh.columns.smaller  # type: ignore[attr-defined]


def test_the_index_has_each_older_turns_line_as_a_summary_model_is_given_it() -> None:
    """A summary model is given the lines of the turns folded since its last summary; they come from the index (each
    plan past the window folds one more turn: splitting the whole transcript into turns for it grew with the run)."""
    from agentfleet.context.compaction import latest_turn_at, turn_line
    from agentfleet.context.older import indexed

    body = _long_run(120, 3)
    cut = latest_turn_at(body)
    history = History.of(body[:40])
    indexed(history.messages, latest_turn_at(history.messages), history.derived)
    grown = history.plus(body[40:])
    older = indexed(grown.messages, cut, grown.derived)
    assert older.lines(0, older.turns) == [turn_line(t) for t in turns_of(body[:cut])]
    assert older.lines(30, 90) == [turn_line(t) for t in turns_of(body[:cut])[30:90]]


def test_tool_definitions_offered_by_an_agent_count_as_their_json_does_and_a_new_result_schema_is_measured_again(
) -> None:
    """An agent's definitions carry their size, measured where each was declared (``ToolSpecs``): the count must be
    the one their JSON gives, for every subset offered, and follow the agent's result schema when it is replaced."""
    from agentfleet import Agent, ScriptedModel, tool
    from agentfleet.context.counting import ToolSpecs, spec_chars

    @tool(read_only=True)
    def look(path: str, depth: int = 1) -> dict:
        """Look at a path — « déjà vu » in UTF-8."""
        return {}

    @tool
    def write(path: str, text: str) -> dict:
        """Write a file."""
        return {}

    agent = Agent("sized", instructions="x", model=ScriptedModel([]), goal_schema={"type": "object"},
                  result_schema={"type": "object", "properties": {"n": {"type": "integer"}}}, tools=[look, write],
                  register=False)
    counter = Heuristic()
    for offered in (None, ["look"], ["write", "look"], []):
        specs = agent.tool_specs(offered)
        assert isinstance(specs, ToolSpecs)
        plain = [dict(s) for s in specs]
        assert specs.chars == sum(map(spec_chars, plain))
        assert counter.tools(specs) == counter.tools(plain)
    import copy
    import pickle

    specs = agent.tool_specs()
    for again in (copy.deepcopy(specs), pickle.loads(pickle.dumps(specs))):  # a copy keeps its definitions and size
        assert isinstance(again, ToolSpecs) and list(again) == list(specs) and again.chars == specs.chars
    before = agent.tool_specs().chars
    agent.result_schema = {"type": "object", "properties": {"a much longer name": {"type": "string"}}}
    assert agent.tool_specs().chars == sum(map(spec_chars, agent.tool_specs())) > before
