"""``repo_report``: counts and summarises the files under a path of the workspace.

Its model is a replay of a recorded session (``cassette.json``), so it runs with
no network and no API key; its tools are real and read the real workspace.
"""

from __future__ import annotations

from pathlib import Path

from agentfleet import Agent, Limits, ReplayModel
from agentfleet.examples.repo_report.tools import count_lines, list_files, read_file

GOAL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "minLength": 1, "description": "Directory to report on"}},
    "required": ["path"],
    "additionalProperties": False,
}

RESULT_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "files": {"type": "integer", "minimum": 0},
        "total_lines": {"type": "integer", "minimum": 0},
        "by_extension": {"type": "object", "additionalProperties": {"type": "integer"}},
        "largest_file": {
            "type": "object",
            "properties": {"path": {"type": ["string", "null"]}, "lines": {"type": "integer"}},
            "required": ["path", "lines"],
        },
        "largest_file_head": {"type": "string"},
        "entries": {"type": "integer", "minimum": 0},
    },
    "required": ["path", "files", "total_lines", "by_extension", "largest_file"],
    "additionalProperties": False,
}

repo_report = Agent(
    "repo_report",
    instructions=(
        "You report on a directory of a code repository: how many files and lines it has, by file "
        "extension, which file is largest, and how that file begins. Use the tools; never guess numbers."
    ),
    model=ReplayModel(Path(__file__).with_name("cassette.json")),
    goal_schema=GOAL_SCHEMA,
    result_schema=RESULT_SCHEMA,
    tools=[list_files, read_file, count_lines],
    limits=Limits(max_steps=8, max_tokens=100_000, max_cost_usd=1.0, deadline_s=120),
)
