"""DBOS: a three-step workflow (plan, tool, observe; each a no-op DBOS step) on the given Postgres.

Runs in the peers' virtual environment. Prints JSON: per-workflow milliseconds and the version.
Each workflow checkpoints its start, each step's output and its end, like one agentfleet iteration.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version

from dbos import DBOS, DBOSConfig


@DBOS.step()
def plan(i: int) -> dict:
    return {"call": "noop", "step": i}


@DBOS.step()
def tool(call: dict) -> dict:
    return {"step": call["step"]}


@DBOS.step()
def observe(result: dict) -> int:
    return result["step"]


@DBOS.workflow()
def iteration(i: int) -> int:
    return observe(tool(plan(i)))


def main(url: str, count: int) -> None:
    config: DBOSConfig = {"name": "afbench", "system_database_url": url, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        for i in range(5):  # warm-up
            iteration(i)
        samples = []
        for i in range(count):
            t0 = time.perf_counter()
            iteration(i)
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        DBOS.destroy()
    print(json.dumps({"peer": "dbos", "version": version("dbos"), "samples_ms": samples}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
