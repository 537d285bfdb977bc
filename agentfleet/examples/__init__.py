"""Agents shipped with agentfleet, ready to run."""
