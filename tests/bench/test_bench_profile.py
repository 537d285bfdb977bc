"""The profile suite's reading of py-spy's collapsed stacks (pure: no services)."""

from __future__ import annotations


def test_py_spy_stacks_are_split_by_package_and_by_our_innermost_call_site() -> None:
    from benchmarks.suites.profile import summarise

    raw = ("<module> (agentfleet/cli.py:1);run_event (agentfleet/roles/step.py:9);"
           "get_run (agentfleet/store/repository.py:170);execute (sqlalchemy/engine/base.py:1) 3\n"
           "<module> (agentfleet/cli.py:1);poll (kombu/asynchronous/hub.py:2) 1\n")
    total, by_package, by_site, by_leaf = summarise(raw)
    assert total == 4
    assert by_package == {"sqlalchemy": 3, "kombu": 1}
    assert by_site["repository.get_run"] == 3
    assert by_leaf["base.execute"] == 3
