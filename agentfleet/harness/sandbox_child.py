"""In the sandbox: a Python tool that opted in to it (``@tool(sandbox=...)``), run as ``python -m`` by its process.

Imports the tool's module again, binds the arguments read from stdin as the executor would, runs the tool and
prints its result as JSON (or a named error); ``ctx.publish`` writes to the events pipe ``$AGENTFLEET_EVENTS``
names. Only the sandboxed process imports this module.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from pydantic_core import to_jsonable_python

from agentfleet.errors import ToolError
from agentfleet.harness.tool_events import ENV, write_events
from agentfleet.tools.tool import Tool, ToolContext


def main(target: str) -> int:
    """In the sandbox: import the tool, run it on stdin's arguments, print its result (or a named error)."""
    module_name, _, attr = target.partition(":")
    declared = getattr(importlib.import_module(module_name), attr)
    if not isinstance(declared, Tool) or declared.func is None:
        print(f"{target} is not a Python tool", file=sys.stderr)
        return 2
    context: ToolContext | None = None
    try:
        kwargs = declared.bind(json.load(sys.stdin))
        if declared.context_param:
            context = kwargs[declared.context_param] = ToolContext(
                run_id=os.environ.get("AGENTFLEET_RUN_ID", ""), call_id=os.environ.get("AGENTFLEET_CALL_ID", ""),
                idempotency_key=os.environ.get("AGENTFLEET_IDEMPOTENCY_KEY", ""), workspace=Path.cwd(),
                attempt=int(os.environ.get("AGENTFLEET_ATTEMPT", "1")))
        value = declared.func(**kwargs)
    except ToolError as exc:
        if context is not None and context.refused:  # the executor checks them again and dead-letters them
            write_events(os.environ[ENV], [(name, payload) for name, payload, _ in context.refused])
        print(json.dumps({"error": {"code": str(exc.code), "message": str(exc), "hint": exc.hint}}))
        print(f"{exc.code}: {exc}", file=sys.stderr)  # what the model sees if the code is not one a tool may give
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    if context is not None and context.published:  # ctx.publish, sent by the executor once the step commits
        write_events(os.environ[ENV], context.published)
    print(json.dumps(to_jsonable_python(value)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
