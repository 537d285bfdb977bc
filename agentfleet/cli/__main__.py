"""``python -m agentfleet.cli``."""

from agentfleet.cli.main import main

main()
