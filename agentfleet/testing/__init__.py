"""Test support as a public package: a chaos run of a real fleet (``agentfleet chaos``)."""
