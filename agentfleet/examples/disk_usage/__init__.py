"""``disk_usage``: how much space a directory of the workspace takes — and the health gate at work.

Its fast tool runs the system's ``du``; a health check makes sure ``du`` answers,
and ``walk_usage`` (pure Python, slower on big trees) is its fallback. Break the
check on purpose with ``AGENTFLEET_DEMO_DU=/no/such/du`` and the planner offers
the fallback instead, telling the model why; ``agentfleet run`` prints that.

The model is scripted (it reads the tool list it is offered and calls the usage
tool it finds there), so the example runs with no network and no API key; the
tools, the check and the gate are real.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import Field

from agentfleet import (
    Agent,
    ErrorCode,
    Limits,
    ModelRequest,
    ModelTurn,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolError,
    health_check,
    tool,
)

DU = os.environ.get("AGENTFLEET_DEMO_DU", "du")
PathArg = Annotated[str, Field(description="Directory, relative to the workspace")]

du_answers = health_check("du", [DU, "-k", os.devnull], tier="local")


@tool(health_check=du_answers, fallback="walk_usage", tier="local", timeout_s=20, read_only=True, cache_ttl_s=10)
def du_usage(ctx: ToolContext, path: PathArg = ".") -> dict:
    """Measure the disk space a directory takes, in KiB of blocks, with the system's du (fast on large trees)."""
    # Opened by descriptor (no link followed on the way) and measured from there: du starts in the directory the
    # descriptor holds, so a directory swapped for a link after the check cannot send it outside. ``du -P``
    # follows no link beneath it either.
    with ctx.files.open(path) as (fd, _st):
        proc = subprocess.run([DU, "-s", "-k", "-P", "."], capture_output=True, text=True, timeout=20, check=False,
                              pass_fds=(fd,), preexec_fn=lambda: os.fchdir(fd))
    if proc.returncode != 0:
        raise ToolError(f"du failed: {proc.stderr.strip()[:200]}", code=ErrorCode.INTERNAL)
    return {"path": path, "kib": int(proc.stdout.split()[0]), "measured_by": "du"}


@tool(tier="local", timeout_s=30, read_only=True, cache_ttl_s=10)
def walk_usage(ctx: ToolContext, path: PathArg = ".") -> dict:
    """Add up the sizes of the regular files under a directory of the workspace (no links followed)."""
    total = files = 0
    for entry in ctx.files.walk(path):
        total += entry.size()
        files += 1
    return {"path": path, "kib": (total + 1023) // 1024, "files": files, "measured_by": "walk"}


def _measure(request: ModelRequest) -> ModelTurn:
    offered = {t["name"] for t in request.tools}
    name = "du_usage" if "du_usage" in offered else "walk_usage"
    return ScriptedModel.calls(ToolCall(id="usage", name=name, arguments={"path": request.goal["path"]}))


def _report(request: ModelRequest) -> ModelTurn:
    seen = request.tool_outputs()["usage"]
    if not seen.get("ok"):
        return ScriptedModel.final({"path": request.goal["path"], "kib": -1, "measured_by": "nothing",
                                    "note": f"{seen.get('error_code')}: {seen.get('message')}"})
    return ScriptedModel.final({**seen["output"], "path": str(PurePosixPath(request.goal["path"]))})


disk_usage = Agent(
    "disk_usage",
    instructions="Report how much disk space the directory in the goal takes. Prefer the fastest tool offered.",
    model=ScriptedModel([_measure, _report], name="scripted:disk-usage"),
    goal_schema={"type": "object", "properties": {"path": {"type": "string", "minLength": 1}},
                 "required": ["path"], "additionalProperties": False},
    result_schema={"type": "object",
                   "properties": {"path": {"type": "string"}, "kib": {"type": "integer"},
                                  "files": {"type": "integer"}, "measured_by": {"type": "string"},
                                  "note": {"type": "string"}},
                   "required": ["path", "kib", "measured_by"], "additionalProperties": False},
    tools=[du_usage, walk_usage],
    limits=Limits(max_steps=4, max_tokens=20_000, max_cost_usd=0.1, deadline_s=60),
)
