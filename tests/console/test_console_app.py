"""The console over an embedded fleet (in-process broker, SQLite): sign-in, CSRF, every page, the actions, masking.

Pages are fetched with Starlette's test client (no browser; ``test_console_browser.py`` drives a real one). The
fleet's runtime is the console's, as ``agentfleet console`` beside a fleet has one of its own.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from agentfleet.config.settings import get_settings
from agentfleet.console.app import create_console
from agentfleet.console.auth import Credentials, check_listen
from agentfleet.errors import ConfigurationError
from agentfleet.loop.states import RunState
from agentfleet.store import tables as T
from agentfleet.workers.embedded import EmbeddedFleet
from tests.helpers import embedded_fleet, eventually, wait_for_run

CANARY = "tok-canary-7Q9xZ41"  # under a secret-named argument: masked by its name only, configured nowhere
PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    with embedded_fleet(tmp_path_factory.mktemp("ws"), "tests.fixtures.agents", AGENTFLEET_APPROVAL_POLL_S="0.1",
                        AGENTFLEET_CONSOLE_CREDENTIALS=f"ann:{PASSWORD},bob:another-password") as running:
        yield running


@pytest.fixture(autouse=True)
def _isolated_settings() -> None:
    """The module-scoped fleet owns its settings."""


@pytest.fixture(scope="module")
def console(fleet: EmbeddedFleet) -> TestClient:
    return TestClient(create_console(get_settings(), fleet.runtime), follow_redirects=False)


def csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, page[:500]
    return found.group(1)


def sign_in(client: TestClient, name: str = "ann", password: str = PASSWORD) -> Any:
    token = csrf(client.get("/login").text)
    return client.post("/login", data={"csrf_token": token, "username": name, "password": password, "next": "/runs"})


@pytest.fixture(scope="module")
def signed_in(console: TestClient) -> TestClient:
    assert sign_in(console).status_code == 303
    return console


def start_payer(fleet: EmbeddedFleet, **arguments: Any) -> str:
    call = ["p", "pay", {"payee": "acme", "amount": 7, "token": CANARY, **arguments}]
    return fleet.submit({"agent": "payer", "input": {"calls": [call]}, "goal_id": uuid.uuid4().hex})


def waiting(fleet: EmbeddedFleet, run_id: str) -> None:
    eventually(lambda: (run := fleet.store.get_run(run_id)) is not None and run.state == RunState.WAITING_APPROVAL)


# -- who may come in ---------------------------------------------------------------------------------------------


def test_credentials_are_name_password_pairs_and_another_interface_needs_them() -> None:
    assert Credentials.parse("a:12345678,b:abcdefgh").check("b", "abcdefgh")
    assert not Credentials.parse("a:12345678").check("a", "1234567")
    assert not Credentials.parse("a:12345678").check("b", "12345678")
    for bad in ("a", "a:short", ":12345678"):
        with pytest.raises(ConfigurationError):
            Credentials.parse(bad)
    check_listen("127.0.0.1", Credentials())
    check_listen("::1", Credentials())
    with pytest.raises(ConfigurationError, match="anyone"):
        check_listen("0.0.0.0", Credentials())
    check_listen("0.0.0.0", Credentials.parse("a:12345678"))


def test_every_page_sends_a_stranger_to_sign_in_and_every_stream_and_post_answers_401(console: TestClient) -> None:
    stranger = TestClient(console.app, follow_redirects=False)
    for path in ("/runs", "/runs/x", "/approvals", "/dlq", "/fleet", "/activity", "/runs/table", "/approvals/list"):
        got = stranger.get(path)
        assert got.status_code == 303 and got.headers["location"].startswith("/login?next="), path
    assert stranger.get("/events/runs").status_code == 401
    assert stranger.post("/fleet/scale", data={"role": "planner", "total": "3"}).status_code == 401
    assert stranger.get("/healthz").status_code == 200


def test_without_credentials_it_serves_loopback_names_to_anyone_and_nothing_else(fleet: EmbeddedFleet) -> None:
    settings = get_settings().model_copy(update={"console_credentials": None})
    app = create_console(settings, fleet.runtime)
    local = TestClient(app, base_url="http://127.0.0.1:5580", follow_redirects=False)
    page = local.get("/runs")
    assert page.status_code == 200 and "(local console)" in page.text and "sign out" not in page.text
    assert local.post("/fleet/scale", data={"role": "planner", "total": "2"}).status_code == 403  # CSRF still
    assert TestClient(app, base_url="http://localhost", follow_redirects=False).get("/runs").status_code == 200
    assert TestClient(app, base_url="http://[::1]:5580", follow_redirects=False).get("/runs").status_code == 200
    rebound = TestClient(app, base_url="http://evil.example:5580", follow_redirects=False)
    assert rebound.get("/runs").status_code == 403  # DNS rebinding: another site's name pointed at 127.0.0.1


def test_a_wrong_password_is_refused_and_the_right_one_signs_in(console: TestClient) -> None:
    client = TestClient(console.app, follow_redirects=False)
    refused = sign_in(client, "ann", "wrong-password")
    assert refused.status_code == 401 and "wrong name or password" in refused.text
    assert sign_in(client, "nobody", PASSWORD).status_code == 401
    assert client.get("/runs").status_code == 303  # still outside
    assert sign_in(client).headers["location"] == "/runs"
    assert client.get("/runs").status_code == 200


def test_sign_in_without_its_csrf_token_is_refused_and_next_never_leaves_the_console(console: TestClient) -> None:
    client = TestClient(console.app, follow_redirects=False)
    client.get("/login")
    assert client.post("/login", data={"username": "ann", "password": PASSWORD}).status_code == 403
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil"):
        fresh = TestClient(console.app, follow_redirects=False)  # a sign-in starts a new session (and token)
        went = fresh.post("/login", data={"csrf_token": csrf(fresh.get("/login").text), "username": "ann",
                                          "password": PASSWORD, "next": target})
        assert went.headers["location"] == "/runs", target


def test_every_post_without_the_csrf_token_or_from_another_origin_is_refused(signed_in: TestClient) -> None:
    token = csrf(signed_in.get("/runs").text)
    posts = [r for r in signed_in.app.routes if isinstance(r, Route) and "POST" in (r.methods or set())]
    assert {r.path for r in posts} >= {"/login", "/logout", "/runs/{run_id:str}/cancel", "/fleet/scale",
                                       "/approvals/{run_id:str}/{call_id:str}", "/dlq/{letter_id:str}/replay"}
    for route in posts:
        path = re.sub(r"\{[a-z_]+:str\}", "x", route.path)
        assert signed_in.post(path, data={"role": "planner", "total": "2"}).status_code == 403, path
        assert signed_in.post(path, data={"csrf_token": "x" * 43}).status_code == 403, path
        assert signed_in.post(path, data={"csrf_token": token}, headers={"origin": "https://evil.example"}
                              ).status_code == 403, path


# -- pages --------------------------------------------------------------------------------------------------


def test_runs_are_paged_newest_first_by_cursor_filtered_and_found_by_goal_id(
        signed_in: TestClient, fleet: EmbeddedFleet) -> None:
    ids = [fleet.submit({"agent": "modest", "input": {"n": i}, "goal_id": f"page-{uuid.uuid4().hex}"})
           for i in range(3)]
    for run_id in ids:
        wait_for_run(fleet.store, run_id)
    first = signed_in.get("/runs/table", params={"agent": "modest"}).text
    shown = re.findall(r'data-run="([^"]+)"', first)
    assert shown[:3] == ids[::-1]
    page = signed_in.get("/runs", params={"agent": "modest"})
    assert page.status_code == 200 and "data-live-events" in page.text
    run = fleet.store.get_run(ids[1])
    found = signed_in.get("/runs/table", params={"goal": run.goal_id}).text  # type: ignore[union-attr]
    assert re.findall(r'data-run="([^"]+)"', found) == [ids[1]]
    assert signed_in.get("/runs/table", params={"state": "FAILED", "agent": "modest"}).text.count("data-run=") == 0
    for bad in ({"state": "nope"}, {"cursor": "!!"}, {"cursor": "YWJj"}, {"since": "yesterday-ish"}):
        assert signed_in.get("/runs", params=bad).status_code == 400, bad


def test_a_deep_page_follows_from_the_cursor_without_repeating_or_skipping(
        signed_in: TestClient, fleet: EmbeddedFleet) -> None:
    from agentfleet.ops.runs import RunsQuery, runs_page

    seen: list[str] = []
    cursor = None
    while True:
        page = runs_page(fleet.store, RunsQuery(limit=2, cursor=cursor))
        seen += [r["run_id"] for r in page.rows]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    everything = [r.run_id for r in fleet.store.list_runs(limit=10_000)]
    assert seen == everything and len(set(seen)) == len(seen)


def test_a_run_page_shows_its_tree_of_delegated_runs_and_each_iteration(
        signed_in: TestClient, fleet: EmbeddedFleet) -> None:
    run_id = fleet.submit({"agent": "asker", "input": {"queries": ["alpha", "beta"]}, "goal_id": uuid.uuid4().hex})
    wait_for_run(fleet.store, run_id)
    eventually(lambda: all(c.state == RunState.SUCCEEDED for c in fleet.store.children(run_id)))
    page = signed_in.get(f"/runs/{run_id}").text
    children = [c.run_id for c in fleet.store.children(run_id)]
    assert len(children) == 2
    assert set(re.findall(r'data-tree-run="([^"]+)"', page)) == {run_id, *children}
    assert "delegate call d0" in page and "slow_echo" in page and "SUCCEEDED" in page
    body = signed_in.get(f"/runs/{run_id}/body").text
    assert "<html" not in body and 'data-tree-run="' in body
    assert signed_in.get("/runs/no-such-run").status_code == 404


def test_an_approval_is_answered_from_the_page_with_edits_checked_by_the_schema_and_the_secret_kept(
        signed_in: TestClient, fleet: EmbeddedFleet) -> None:
    run_id = start_payer(fleet)
    waiting(fleet, run_id)
    page = html.unescape(signed_in.get("/approvals").text)
    assert f'data-approval="{run_id} p"' in page
    assert CANARY not in page
    assert '"token": "***"' in page
    token = csrf(page)
    broken = signed_in.post(f"/approvals/{run_id}/p", data={
        "csrf_token": token, "decision": "approve_edited", "arguments": '{"payee": "globex", "amount": "lots", '
                                                                       '"token": "***"}'})
    assert "INVALID_ARGUMENTS" in broken.headers["location"]
    assert fleet.store.get_run(run_id).state == RunState.WAITING_APPROVAL  # type: ignore[union-attr]
    for junk in ("not json", "[1, 2]"):
        said = signed_in.post(f"/approvals/{run_id}/p", data={"csrf_token": token, "decision": "approve_edited",
                                                               "arguments": junk})
        assert "error=" in said.headers["location"], junk
    done = signed_in.post(f"/approvals/{run_id}/p", data={
        "csrf_token": token, "decision": "approve_edited", "note": "vendor changed",
        "arguments": '{"payee": "globex", "amount": 5, "token": "***"}'})
    assert "done=" in done.headers["location"], done.headers["location"]
    run = wait_for_run(fleet.store, run_id)
    assert run.state == RunState.SUCCEEDED
    [tool_step] = [s for s in fleet.store.steps(run_id) if s["kind"] == "tool"]
    assert tool_step["input"] == {"payee": "globex", "amount": 5, "token": CANARY}  # the secret came back whole
    [answered] = fleet.store.approvals_of(run_id)
    assert (answered.status, answered.resolved_by) == ("approved", "ann")
    [action] = fleet.store.actions(run_id=run_id, limit=10)[:1]
    assert (action["actor"], action["via"], action["action"], action["outcome"]) == ("ann", "console", "approve",
                                                                                      "accepted")
    assert action["detail"]["edited"] is True and CANARY not in json.dumps(action["detail"])  # the approval keeps them
    again = signed_in.post(f"/approvals/{run_id}/p", data={"csrf_token": token, "decision": "approve"})
    assert "APPROVAL_NOT_PENDING" in again.headers["location"]
    run_page = html.unescape(signed_in.get(f"/runs/{run_id}").text)
    assert "approved by ann" in run_page and "globex" in run_page and CANARY not in run_page


def test_a_denial_needs_a_reason_and_reaches_the_model(signed_in: TestClient, fleet: EmbeddedFleet) -> None:
    run_id = start_payer(fleet)
    waiting(fleet, run_id)
    token = csrf(signed_in.get("/approvals").text)
    assert "needs a reason" in signed_in.post(f"/approvals/{run_id}/p", data={
        "csrf_token": token, "decision": "deny"}).headers["location"].replace("+", " ")
    signed_in.post(f"/approvals/{run_id}/p", data={"csrf_token": token, "decision": "deny", "note": "not today"})
    assert wait_for_run(fleet.store, run_id).state == RunState.SUCCEEDED  # the model was told, and carried on


def test_a_cancel_from_the_run_page_ends_the_run_and_is_recorded(signed_in: TestClient, fleet: EmbeddedFleet) -> None:
    run_id = start_payer(fleet)
    waiting(fleet, run_id)
    page = signed_in.get(f"/runs/{run_id}").text
    assert 'id="cancel"' in page
    signed_in.post(f"/runs/{run_id}/cancel", data={"csrf_token": csrf(page), "reason": "wrong vendor"})
    assert wait_for_run(fleet.store, run_id).state == RunState.CANCELLED
    assert [(a["action"], a["detail"]["reason"]) for a in fleet.store.actions(run_id=run_id)] == [
        ("cancel", "wrong vendor")]


def test_no_page_or_fragment_holds_a_secret_from_a_tool_argument(signed_in: TestClient, fleet: EmbeddedFleet
                                                                 ) -> None:
    run_id = start_payer(fleet)
    waiting(fleet, run_id)
    paths = ["/runs", "/runs/table", f"/runs/{run_id}", f"/runs/{run_id}/body", "/approvals", "/approvals/list",
             "/activity", f"/runs?goal={fleet.store.get_run(run_id).goal_id}"]  # type: ignore[union-attr]
    for path in paths:
        got = signed_in.get(path)
        assert got.status_code == 200 and CANARY not in html.unescape(got.text), path
        assert got.headers["cache-control"] == "no-store" and "frame-ancestors 'none'" in got.headers[
            "content-security-policy"]
    with fleet.store.reading() as conn:  # it is stored whole: the fleet needs it; only what is shown is masked
        stored = conn.execute(T.approvals.select().where(T.approvals.c.run_id == run_id)).first()
    assert stored.arguments["token"] == CANARY  # type: ignore[union-attr]


def test_the_activity_page_charts_what_it_read_and_escapes_labels(signed_in: TestClient) -> None:
    page = signed_in.get("/activity").text
    assert page.count("<svg") == 4 and "model turns" in page


def test_an_oversized_form_is_refused_before_it_is_read_even_unsigned(console: TestClient) -> None:
    stranger = TestClient(console.app, follow_redirects=False)
    token = csrf(stranger.get("/login").text)
    huge = {"csrf_token": token, "username": "ann", "password": "x" * (2 << 20)}  # 2 MiB, urlencoded
    assert stranger.post("/login", data=huge).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield f"csrf_token={token}&username=ann&password=".encode()
        for _ in range(64):
            yield b"y" * 65536

    assert stranger.post("/login", content=chunks(),
                         headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 413
    assert stranger.post("/login", content=b"username=a&password=b",
                         headers={"content-type": "application/x-www-form-urlencoded",
                                  "content-length": "999999999"}).status_code == 413
