"""Shared state of the fleet in Redis (gate, health cache, breaker, result cache, locks, stop marks), and the
dispatch that consults it before a call is handed to the harness."""
