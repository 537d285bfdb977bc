"""A thread's earlier exchanges in the prompt: the newest whole, older ones as lines, within the budget."""

from __future__ import annotations

from agentfleet.context.counting import Heuristic
from agentfleet.context.thread import thread_messages


def exchanges(n: int, size: int = 40) -> list[dict]:
    return [{"input": {"q": f"question {i} " + "x" * size},
             "result": {"status": "succeeded", "output": {"a": f"answer {i}"}}} for i in range(n)]


def test_everything_fits_whole_in_order() -> None:
    msgs = thread_messages(exchanges(3), 10_000, Heuristic())
    assert [m.role for m in msgs] == ["user", "assistant"] * 3
    assert "question 0" in (msgs[0].content or "") and "answer 2" in (msgs[-1].content or "")


def test_the_newest_stay_whole_older_ones_fold_to_lines_and_the_budget_holds() -> None:
    counter = Heuristic()
    for budget in (60, 150, 300, 600):
        msgs = thread_messages(exchanges(30), budget, counter)
        assert counter.messages(msgs) <= budget
        if msgs and msgs[-1].role == "assistant":
            assert "answer 29" in (msgs[-1].content or "")  # the newest is always the one kept whole
    msgs = thread_messages(exchanges(30), 600, counter)
    assert msgs[0].role == "user" and (msgs[0].content or "").startswith("Earlier in this conversation")
    folded = (msgs[0].content or "").splitlines()[1:]
    whole = [m for m in msgs[1:] if m.role == "user"]
    assert folded and whole
    first_whole = int((whole[0].content or "").split("question ")[1].split()[0])
    last_line = int(folded[-1].split("question ")[1].split()[0])
    assert last_line == first_whole - 1  # the lines run up to the first exchange kept whole


def test_a_failed_run_is_shown_as_failed_and_nothing_fits_nothing_is_shown() -> None:
    failed = [{"input": {"q": "a"}, "result": {"status": "failed", "error_code": "DEADLINE", "message": "slow"}}]
    (_goal, answer) = thread_messages(failed, 1000, Heuristic())
    assert '"failed"' in (answer.content or "") and "DEADLINE" in (answer.content or "")
    assert thread_messages(exchanges(5), 1, Heuristic()) == []
