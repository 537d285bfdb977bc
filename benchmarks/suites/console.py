"""The console with 100,000 runs in the database: how long each page takes to render, served by uvicorn in this
process and fetched over HTTP by a signed-in client (the browser's own work is not counted).

The runs are copies of 20 real ones (bench_loop, 3 iterations, with their steps and audit rows), spread over the
last two weeks, one in ten FAILED; the pages read through ``ops/`` exactly as people's browsers make them.
"""

from __future__ import annotations

import re
import socket
import threading
import time

import httpx
from pydantic import SecretStr
from sqlalchemy import text

from agentfleet.console.server import server
from agentfleet.roles.runtime import runtime_for
from agentfleet.store import tables as T
from agentfleet.workers.app import create_app
from benchmarks.common import ONE_EACH, Report, Sizes, clone_runs, fleet, wait_until

SUITE = "console"
SEEDS = 20
FETCHES = 20  # of each page
PASSWORD = "bench-console-password"
DEEP_PAGE = 200  # of 50 runs


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(sizes: Sizes, report: Report) -> None:
    with fleet(ONE_EACH) as f:
        seeds = f.submit("bench_loop", [{"iterations": 3}] * SEEDS)
        for run_id in seeds:
            f.wait(run_id)
        copies = max(sizes.console_runs // SEEDS, 1)
        spread = {"created_at": "t.created_at - g * interval '12 seconds'",
                  "updated_at": "t.updated_at - g * interval '12 seconds'",
                  "state": "CASE WHEN g % 10 = 0 THEN 'FAILED' ELSE t.state END"}
        t0 = time.monotonic()
        for table, suffixed in ((T.runs, ("run_id", "goal_id", "trace_id")), (T.steps, ("run_id", "idempotency_key")),
                                (T.audit, ("run_id",))):
            clone_runs(f, table, seeds, copies, suffixed, spread)
        with f.store.engine.connect() as conn:
            conn.execute(text("ANALYZE"))
        made_s = time.monotonic() - t0
        total = f.count("SELECT count(*) FROM runs")
        settings = f.settings.model_copy(update={"console_credentials": SecretStr(f"bench:{PASSWORD}"),
                                                 "redis_url": f.env["AGENTFLEET_REDIS_URL"]})
        port = _port()
        console = server(settings, runtime_for(create_app(settings)), host="127.0.0.1", port=port)
        serving = threading.Thread(target=console.run, daemon=True)
        serving.start()
        try:
            wait_until(lambda: console.started, "the console serves", timeout=30)
            goal_id = f"{f.store.get_run(seeds[3]).goal_id}-c7"  # type: ignore[union-attr]  # a copy's
            timings = _measure(f"http://127.0.0.1:{port}", seeds[0], goal_id)
        finally:
            console.should_exit = True
            serving.join(timeout=10)
    report.add(SUITE, "runs_in_database", total, f"{total:,} runs ({copies * SEEDS:,} copies made in {made_s:.0f} s)")
    for page, samples in timings.items():
        report.add_ms(SUITE, page, samples)


def _measure(base: str, run_id: str, goal_id: str) -> dict[str, list[float]]:
    with httpx.Client(base_url=base, follow_redirects=False, timeout=30) as client:
        login = client.get("/login").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', login).group(1)  # type: ignore[union-attr]
        client.post("/login", data={"csrf_token": token, "username": "bench", "password": PASSWORD, "next": "/runs"})
        first = client.get("/runs").text
        cursor = re.search(r'cursor=([A-Za-z0-9_-]+)', first).group(1)  # type: ignore[union-attr]
        deep, depth = cursor, 2
        while depth < DEEP_PAGE:  # as far down as the runs go, up to the 10,000th run
            more = re.search(r'cursor=([A-Za-z0-9_-]+)', client.get(f"/runs/table?cursor={deep}").text)
            if more is None:
                break
            deep, depth = more.group(1), depth + 1
        pages = {"runs": "/runs", f"runs_page_{depth}": f"/runs?cursor={deep}",
                 "runs_one_agent": "/runs?agent=bench_loop", "runs_failed": "/runs?state=FAILED",
                 "runs_since_1h": "/runs?since=1h", "runs_by_goal_id": f"/runs?goal={goal_id}",
                 "run": f"/runs/{run_id}", "approvals": "/approvals", "activity": "/activity",
                 "fleet": "/fleet", "dlq": "/dlq"}
        found: dict[str, list[float]] = {}
        for name, path in pages.items():
            client.get(path)  # warm
            samples = []
            for _ in range(FETCHES):
                t0 = time.perf_counter()
                got = client.get(path)
                samples.append((time.perf_counter() - t0) * 1000)
                if got.status_code != 200:
                    raise RuntimeError(f"{path}: {got.status_code} {got.text[:200]}")
            found[name] = samples
        return found
