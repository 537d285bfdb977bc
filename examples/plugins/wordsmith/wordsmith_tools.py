"""The wordsmith plugin's tools: every manifest in this folder (other plugins import them from here)."""

from pathlib import Path

from agentfleet import load_tool_folder

TOOLS = {t.name: t for t in load_tool_folder(Path(__file__).parent)}
shout = TOOLS["shout"]
