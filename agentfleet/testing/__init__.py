"""Test support as a public package: one goal through an in-process fleet (``run_goal``), and a chaos run
of a real fleet (``agentfleet chaos``)."""

from agentfleet.testing.runs import run_goal

__all__ = ["run_goal"]
