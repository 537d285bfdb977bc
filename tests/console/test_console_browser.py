"""The console in a real browser (Debian's Chromium, driven by Playwright) over a real fleet: RabbitMQ, Postgres,
Redis, worker processes; runs started from the CLI as an operator would.

``AGENTFLEET_SCREENSHOTS=docs/console`` also saves a screenshot of each page there (the README shows them).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentfleet import constants as C
from agentfleet.config.settings import Settings
from agentfleet.loop.states import RunState
from agentfleet.roles.runtime import runtime_for
from agentfleet.store import Store, make_engine
from agentfleet.workers.app import create_app
from tests.conftest import BROKER_URL, REDIS_URL, ROOT, TEST_AGENTS, WorkerProcs, require
from tests.helpers import AmqpClient, eventually

pytestmark = [pytest.mark.integration, pytest.mark.browser]

PASSWORD = "console-test-password"
CANARY = "tok-canary-B7r2Kq9"  # a tool argument under a secret-looking name; configured as a secret nowhere
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
SHOTS = os.environ.get("AGENTFLEET_SCREENSHOTS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet:
    def __init__(self, env: dict[str, str], store: Store, base: str, workspace: Path) -> None:
        self.env, self.store, self.base, self.workspace = env, store, base, workspace

    def cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "agentfleet.cli", *args], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    def submit(self, agent: str, goal: dict[str, Any]) -> str:
        out = self.cli("submit", agent, "--input", json.dumps(goal), "--goal-id", f"{agent}-{uuid.uuid4().hex}")
        found = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", out)
        assert found, out
        return found.group(0)


@pytest.fixture(scope="module")
def fleet(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require("rabbitmq", "postgres", "redis")
    if not Path(CHROMIUM).exists():
        message = "Chromium is not installed (make test installs it: .ci/tools)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    workspace = tmp_path_factory.mktemp("console")
    namespace = f"aftest-console-{uuid.uuid4().hex[:6]}"
    port = _free_port()
    env = {"AGENTFLEET_PROFILE": "distributed", "AGENTFLEET_BROKER_URL": BROKER_URL, "AGENTFLEET_REDIS_URL": REDIS_URL,
           "AGENTFLEET_DATABASE_URL": pg_url, "AGENTFLEET_NAMESPACE": namespace, "AGENTFLEET_AGENTS": TEST_AGENTS,
           "AGENTFLEET_WORKSPACE": str(workspace), "AGENTFLEET_LOG_LEVEL": "INFO", "PYTHONPATH": str(ROOT)}
    workers = WorkerProcs(env, workspace / "logs", cwd=ROOT)
    for role in (C.PLANNER, C.EXECUTOR, C.OBSERVER):
        workers.start(role)
    settings = Settings(profile="distributed", broker_url=BROKER_URL, redis_url=REDIS_URL, database_url=pg_url,
                        namespace=namespace, agents=TEST_AGENTS, workspace=workspace,
                        console_credentials=f"ann:{PASSWORD}")  # type: ignore[arg-type]
    from agentfleet.console.server import server

    console = server(settings, runtime_for(create_app(settings)), host="127.0.0.1", port=port)
    serving = threading.Thread(target=console.run, name="console", daemon=True)
    serving.start()
    engine = make_engine(pg_url)
    try:
        workers.wait_ready()
        eventually(lambda: console.started, timeout=30, message="the console serves")
        yield Fleet(env, Store(engine), f"http://127.0.0.1:{port}", workspace)
    finally:
        console.should_exit = True
        serving.join(timeout=10)
        workers.stop()
        engine.dispose()
        from kombu import Connection

        from agentfleet.agents.registry import fleet_agents
        from agentfleet.events.topology import Topology

        with Connection(BROKER_URL) as conn:
            Topology(namespace, tool_queues=fleet_agents(settings).tool_queues()).delete(conn)


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module's fleet owns its settings."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


def sign_in(browser: Any, fleet: Fleet, password: str = PASSWORD) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{fleet.base}/runs")
    assert "/login" in page.url  # sent to sign in first
    page.fill("input[name=username]", "ann")
    page.fill("input[name=password]", password)
    page.click("#login button[type=submit]")
    return page


@pytest.fixture(scope="module")
def page(browser: Any, fleet: Fleet) -> Any:
    signed_in = sign_in(browser, fleet)
    signed_in.wait_for_url(f"{fleet.base}/runs")
    return signed_in


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=False)


def wait_live(page: Any) -> None:
    """Wait until the page's event stream is open.

    A locator, not ``wait_for_function``: Playwright re-evaluates a string predicate with ``eval`` in the page on
    every poll, which the console's CSP (no ``unsafe-eval``) refuses -- it passed only where the stream was already
    open at the first, DevTools-evaluated, check (CI's slower machine polled, and failed).
    """
    page.locator("body[data-live='on']").wait_for(state="attached")


def test_a_wrong_password_is_refused(browser: Any, fleet: Fleet) -> None:
    refused = sign_in(browser, fleet, "not-the-password")
    refused.wait_for_selector("#login-error")
    assert "wrong name or password" in refused.inner_text("#login-error")
    assert "/login" in refused.url
    refused.goto(f"{fleet.base}/approvals")
    assert "/login" in refused.url  # still outside
    refused.context.close()


def test_a_run_started_from_the_cli_appears_live_and_its_tree_shows_the_delegated_children(
        page: Any, fleet: Fleet) -> None:
    page.goto(f"{fleet.base}/runs")
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    run_id = fleet.submit("asker", {"queries": ["alpha", "beta"]})
    page.wait_for_selector(f'tr[data-run="{run_id}"]')  # appeared without a reload
    assert page.evaluate("window.__notReloaded") is True

    page.click(f'tr[data-run="{run_id}"] a')
    page.wait_for_url(f"{fleet.base}/runs/{run_id}")
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    page.wait_for_selector("#run-end")  # it ends while watched, without a reload
    eventually(lambda: len(fleet.store.children(run_id)) == 2
               and all(c.state == RunState.SUCCEEDED for c in fleet.store.children(run_id)), timeout=60)
    children = {c.run_id for c in fleet.store.children(run_id)}
    from playwright.sync_api import expect

    expect(page.locator("#tree [data-tree-run]")).to_have_count(3, timeout=30_000)
    shown = set(page.eval_on_selector_all("#tree [data-tree-run]", "els => els.map(e => e.dataset.treeRun)"))
    assert shown == {run_id, *children}
    assert page.inner_text("#tree").count("delegate call") == 2
    assert "SUCCEEDED" in page.inner_text("#run-state")
    assert page.evaluate("window.__notReloaded") is True
    shot(page, "run")
    page.goto(f"{fleet.base}/runs")
    shot(page, "runs")


def test_an_answer_being_written_is_not_wiped_by_a_live_refresh(page: Any, fleet: Fleet) -> None:
    """The live list re-rendered on any change unless a field in it had the focus: an edit left for a moment (a click
    elsewhere, to read the run) was wiped by the next change, and the approval then went with the arguments as asked.
    An answer typed and not sent holds the refresh back until it is sent."""
    page.goto(f"{fleet.base}/approvals")
    wait_live(page)
    first = fleet.submit("payer", {"calls": [["p", "pay", {"payee": "acme", "amount": 5}]]})
    card = page.locator(f'article[data-approval="{first} p"]')
    card.locator("summary").click()
    box = card.locator("textarea[name=arguments]")
    box.fill(json.dumps({"payee": "initech", "amount": 5}))
    card.locator("h2").click()  # the field loses the focus; what was typed stays unsent
    page.evaluate("document.querySelectorAll('[data-held]').forEach(e => e.removeAttribute('data-held'))")  # counted
    second = fleet.submit("payer", {"calls": [["p", "pay", {"payee": "acme", "amount": 6}]]})
    # a refresh tried since the field lost the focus: the list either re-rendered (the second card is there, and with
    # it the edit is gone) or held the refresh back (data-held, set anew: a hold while the summary had the focus
    # was cleared above)
    page.locator(f'article[data-approval="{second} p"], [data-live-src][data-held]').first.wait_for(state="attached")
    assert json.loads(box.input_value())["payee"] == "initech"
    card.locator("button[value=approve_edited]").click()
    page.wait_for_selector("#answer-done")
    run = eventually(lambda: (r := fleet.store.get_run(first)) is not None and r.result is not None and r,
                     timeout=60, message="the approved run ends")
    [tool_step] = [s for s in fleet.store.steps(first) if s["kind"] == "tool"]
    assert tool_step["input"]["payee"] == "initech", run.result
    later = page.locator(f'article[data-approval="{second} p"]')  # the list is live again: the second is answered
    later.locator("input[name=note]").fill("not this one")
    later.locator("button[value=deny]").click()
    eventually(lambda: not any(a.run_id == second for a in fleet.store.pending_approvals()), timeout=30,
               message="the second is denied")


def test_a_pending_approval_is_approved_with_an_edited_argument_from_the_page(page: Any, fleet: Fleet) -> None:
    """Locators, not element handles: the live list re-renders on every change, and a handle taken before one points
    at an element no longer on the page (CI: 'Element is not attached to the DOM')."""
    page.goto(f"{fleet.base}/approvals")
    wait_live(page)
    run_id = fleet.submit("payer", {"calls": [["p", "pay", {"payee": "acme", "amount": 7, "token": CANARY}]]})
    card = page.locator(f'article[data-approval="{run_id} p"]')
    card.wait_for()  # asked while the page was open
    assert CANARY not in card.inner_html()
    shot(page, "approvals")
    card.locator("summary").click()
    box = card.locator("textarea[name=arguments]")
    edited = json.loads(box.input_value())
    assert edited == {"payee": "acme", "amount": 7, "token": "***"}
    box.fill(json.dumps({**edited, "payee": "globex"}))
    card.locator("button[value=approve_edited]").click()
    page.wait_for_selector("#answer-done")
    run = eventually(lambda: (r := fleet.store.get_run(run_id)) is not None and r.result is not None and r,
                     timeout=60, message="the approved run ends")
    assert run.state == RunState.SUCCEEDED, run.result
    [tool_step] = [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"]
    assert tool_step["input"] == {"payee": "globex", "amount": 7, "token": CANARY}  # the edit, and the secret whole
    ledger = (fleet.workspace / f"ledger-{run_id}.txt").read_text().split(":")
    assert ledger[:3] == ["pay", "globex", "7"]  # the tool saw the edit
    page.goto(f"{fleet.base}/runs/{run_id}")
    assert "approved by ann" in page.inner_text("#timeline")
    [action] = fleet.store.actions(run_id=run_id)
    assert (action["actor"], action["via"], action["action"]) == ("ann", "console", "approve")


def test_a_post_without_its_csrf_token_is_refused(page: Any, fleet: Fleet) -> None:
    refused = page.request.post(f"{fleet.base}/fleet/scale", form={"role": "planner", "total": "4"})
    assert refused.status == 403
    run_id = fleet.store.list_runs(limit=1)[0].run_id
    assert page.request.post(f"{fleet.base}/runs/{run_id}/cancel", form={"reason": "x"}).status == 403
    assert fleet.store.actions(run_id=run_id) == [] or all(a["action"] != "cancel"
                                                           for a in fleet.store.actions(run_id=run_id))


def test_no_page_holds_the_canary_secret(page: Any, fleet: Fleet) -> None:
    run_id = fleet.submit("payer", {"calls": [["p", "pay", {"payee": "acme", "amount": 9, "token": CANARY}]]})
    eventually(lambda: any(a.run_id == run_id for a in fleet.store.pending_approvals()), timeout=60)
    client = AmqpClient()  # and a goal the inbox refuses (no such agent), dead-lettered with the canary in its body
    client.publish_goal(fleet.env["AGENTFLEET_NAMESPACE"], "goal.nobody",
                        {"agent": "nobody", "input": {"token": CANARY}, "goal_id": uuid.uuid4().hex})
    page.goto(f"{fleet.base}/dlq")
    eventually(lambda: page.reload() or page.query_selector("a[href^='/dlq/']"), timeout=30,
               message="the refused goal is a dead letter")
    letter = page.get_attribute("a[href^='/dlq/']", "href")
    pages = ["/runs", f"/runs/{run_id}", "/approvals", "/dlq", letter, "/fleet", "/activity",
             f"/runs?goal={fleet.store.get_run(run_id).goal_id}"]  # type: ignore[union-attr]
    for path in pages:
        page.goto(f"{fleet.base}{path}")
        page.wait_for_load_state("domcontentloaded")
        assert CANARY not in html.unescape(page.content()), path
        if path in ("/fleet", "/activity", "/dlq"):
            shot(page, path.strip("/"))
    assert "nobody" in page.goto(f"{fleet.base}{letter}").text()  # the letter's page shows the body, masked


def test_a_dead_letter_is_replayed_and_a_role_scaled_from_their_pages(page: Any, fleet: Fleet) -> None:
    page.goto(f"{fleet.base}/dlq")
    letter = page.get_attribute("a[href^='/dlq/']", "href")  # the refused goal of the test before
    page.goto(f"{fleet.base}{letter}")
    page.click("form[action$='/replay'] button")
    page.wait_for_url(re.compile(r".*/dlq\?done=.*"))
    assert "replayed" in page.inner_text("p.done") or "sent" in page.inner_text("p.done"), page.inner_text("p.done")
    [replayed] = [a for a in fleet.store.actions(limit=20) if a["action"] == "replay"][:1]
    assert (replayed["actor"], replayed["via"], replayed["outcome"]) == ("ann", "console", "accepted")

    page.goto(f"{fleet.base}/fleet")
    section = page.locator("#role-observer")
    before = int(section.locator("input[name=total]").input_value())
    section.locator("input[name=total]").fill(str(before + 2))
    section.locator("button[type=submit]").click()
    page.wait_for_selector("p.done")
    assert f"{before} → {before + 2}" in page.inner_text("p.done")
    [scaled] = [a for a in fleet.store.actions(limit=20) if a["action"] == "scale"][:1]
    assert (scaled["target"], scaled["detail"]["total"], scaled["actor"]) == ("observer", before + 2, "ann")
