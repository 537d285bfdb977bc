"""Health-gated dispatch on an in-process Redis (fakeredis): the rules, the cache, the breaker, locks."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import fakeredis
import pytest
import redis

from agentfleet import Agent, ErrorCode, ScriptedModel, ToolContext, health_check, tool
from agentfleet.config.settings import Settings
from agentfleet.errors import ConfigurationError
from agentfleet.fleet.dispatch import ToolDispatch
from agentfleet.fleet.fleet_redis import FleetRedis, no_retry
from agentfleet.fleet.gate import Availability, BreakerEntry, HealthEntry, Transition, offer
from agentfleet.fleet.health_cache import HealthCache, plan_checks
from agentfleet.harness.checks import run_check
from agentfleet.loop.transcript import ToolResult
from agentfleet.tools.health import HealthCheck

SECRET = b"test fleet key"
DOWN = Availability(False, "its health check failed: refused")


def test_a_down_tool_is_not_offered_and_the_model_is_told_why() -> None:
    got = offer([("search", None), ("read", None)], {"search": DOWN})
    assert got.tools == ["read"]
    assert got.notice == "Tools unavailable now: search (its health check failed: refused)."


def test_a_fallback_is_held_in_reserve_and_offered_in_place_of_its_down_primary() -> None:
    tools = [("primary", "backup"), ("backup", None), ("other", None)]
    assert offer(tools, {}).tools == ["primary", "other"]
    replaced = offer(tools, {"primary": DOWN})
    assert replaced.tools == ["backup", "other"]
    assert "use backup instead" in (replaced.notice or "")
    both = offer(tools, {"primary": DOWN, "backup": DOWN})
    assert both.tools == ["other"] and "its fallback backup is unavailable too" in (both.notice or "")


def test_an_unknown_entry_counts_as_healthy_and_a_cooled_breaker_lets_a_trial_through() -> None:
    now = 1000.0
    assert Availability.of(None, None, now, 30).available
    down = HealthEntry("down", "refused", now, "x")
    assert not Availability.of(down, None, now, 30).available
    opened = BreakerEntry("open", now - 10, 5)
    assert not Availability.of(None, opened, now, 30).available
    cooled = Availability.of(None, opened, now + 25, 30)
    assert cooled.available and cooled.trial_due
    assert HealthEntry.loads("not json") is None and BreakerEntry.loads('{"state": "weird"}') is None


# -- the fleet's Redis, in process --------------------------------------------------------

@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def fleet_redis(server: fakeredis.FakeServer) -> FleetRedis:
    return FleetRedis(fakeredis.FakeRedis(server=server, decode_responses=True), "t", secret=SECRET)


def sealed(key: str, entry: HealthEntry | BreakerEntry) -> str:
    """An entry as a fleet process writes it (under the test fleet's key)."""
    return FleetRedis(fakeredis.FakeRedis(), "t", secret=SECRET).seal(key, entry.dumps())


def settings(**overrides: object) -> Settings:
    return Settings(profile="embedded", **overrides)  # type: ignore[arg-type]


def test_an_expired_entry_is_checked_by_one_executor_not_by_each(server: fakeredis.FakeServer) -> None:
    runs: list[float] = []

    def check() -> None:
        runs.append(time.monotonic())
        time.sleep(0.02)

    shared = HealthCheck("svc", check, ttl_s=0.4)
    plans = plan_checks([_tool_with(shared, "a"), _tool_with(shared, "b")])
    assert list(plans) == ["svc"] and plans["svc"].tools == ["a", "b"]  # one check for two tools
    executors = [HealthCache(fleet_redis(server), settings(health_tick_s=0.01), by=f"e{i}", report=lambda t: None)
                 for i in range(4)]
    stop = time.monotonic() + 1.0
    threads = [threading.Thread(target=_tick_until, args=(e, plans, stop)) for e in executors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Four executors ticking every 10 ms for 1 s; a 0.4 s TTL refreshed 0.11 s before expiry: about
    # three or four runs in all, not one per executor each time.
    assert 2 <= len(runs) <= 5, runs


def _tick_until(cache: HealthCache, plans: dict, stop: float, tick: float = 0.01) -> None:
    while time.monotonic() < stop:
        cache.check_due(plans)
        time.sleep(tick)


def _tool_with(check: HealthCheck, name: str):
    @tool(name=name, health_check=check)
    def t() -> dict:
        """A tool."""
        return {}

    return t


def test_only_changes_of_health_are_announced(server: fakeredis.FakeServer) -> None:
    state = {"up": True}

    def check() -> str:
        if not state["up"]:
            raise ConnectionError("refused")
        return "fine"

    changes: list[Transition] = []
    plans = plan_checks([_tool_with(HealthCheck("svc", check, ttl_s=0.05, down_ttl_s=0.05), "a")])
    cache = HealthCache(fleet_redis(server), settings(), by="e1", report=changes.append)
    for up in (True, True, False, False, True):
        state["up"] = up
        time.sleep(0.06)
        assert cache.check_due(plans) == 1
    assert [(c.status, c.detail) for c in changes] == [("down", "ConnectionError: refused"), ("healthy", "fine")]
    assert cache.entries(["a"])["a"].detail == "fine"  # type: ignore[union-attr]


def test_a_command_check_answers_with_its_output_or_its_exit_status() -> None:
    assert run_check(HealthCheck("sh", ("sh", "-c", "echo v1.2.3")), 5).detail == "v1.2.3"
    failed = run_check(HealthCheck("sh", ("sh", "-c", "echo nope >&2; exit 3")), 5)
    assert not failed.healthy and failed.detail == "sh exited 3: nope"
    missing = run_check(HealthCheck("x", ("/no/such/binary",)), 5)
    assert not missing.healthy and "/no/such/binary" in (missing.detail or "")
    slow = run_check(HealthCheck("sh", ("sh", "-c", "sleep 30")), 0.2)
    assert not slow.healthy and "did not answer within 0.2s" in (slow.detail or "")
    hanging = run_check(HealthCheck("py", lambda: time.sleep(30)), 0.1)
    assert not hanging.healthy


# -- dispatch ----------------------------------------------------------------------------

def ctx(tmp_path: Path) -> ToolContext:
    return step_ctx(tmp_path, "k")


def step_ctx(tmp_path: Path, key: str) -> ToolContext:
    return ToolContext(run_id="r", call_id=key, idempotency_key=key, workspace=tmp_path)


def dispatch(server: fakeredis.FakeServer, changes: list[Transition] | None = None, **kw: object) -> ToolDispatch:
    sink = changes.append if changes is not None else (lambda t: None)
    return ToolDispatch(fleet_redis(server), settings(**kw), by="e1", report=sink)


def test_a_down_tool_is_refused_at_once_and_its_body_never_entered(server: fakeredis.FakeServer,
                                                                   tmp_path: Path) -> None:
    entered: list[int] = []

    @tool(fallback="other")
    def lookup() -> dict:
        """Look up."""
        entered.append(1)
        return {}

    d = dispatch(server)
    server_client = fakeredis.FakeRedis(server=server, decode_responses=True)
    server_client.set("t:health:lookup", sealed("t:health:lookup", HealthEntry("down", "refused", time.time(), "e2")))
    result = d.call(lookup, {}, ctx(tmp_path))
    assert result.error_code == ErrorCode.TOOL_UNAVAILABLE and result.retryable
    assert "Use other instead" in (result.hint or "") and "health check failed" in (result.message or "")
    assert "refused" not in (result.message or "")  # the check's own words are for operators, not the model
    assert entered == []


def test_the_breaker_opens_lets_one_trial_through_and_closes(server: fakeredis.FakeServer, tmp_path: Path) -> None:
    broken = {"on": True}
    entered: list[float] = []

    @tool(timeout_s=5)
    def svc() -> dict:
        """A service."""
        entered.append(time.monotonic())
        if broken["on"]:
            raise ConnectionError("reset")
        time.sleep(0.3)
        return {"ok": True}

    changes: list[Transition] = []
    # the refusal below must land inside the cooldown: wide enough for a busy CI machine
    a = dispatch(server, changes, breaker_failures=3, breaker_cooldown_s=1.5)
    b = dispatch(server, changes, breaker_failures=3, breaker_cooldown_s=1.5)
    for d in (a, b, a):
        assert d.call(svc, {}, ctx(tmp_path)).error_code == ErrorCode.INTERNAL
    refused = b.call(svc, {}, ctx(tmp_path))
    assert refused.error_code == ErrorCode.TOOL_UNAVAILABLE and "circuit open" in (refused.message or "")
    assert len(entered) == 3 and [c.status for c in changes] == ["open"]
    assert not a.offer([svc]).tools  # the planner's view agrees

    broken["on"] = False
    time.sleep(1.6)
    results: list[ToolResult] = []
    callers = [threading.Thread(target=lambda d=d: results.append(d.call(svc, {}, ctx(tmp_path))))
               for d in (a, b, a, b)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(entered) == 4  # exactly one trial ran, across both "executors"
    assert sorted(r.ok for r in results) == [False, False, False, True]
    assert all("testing whether it has recovered" in (r.message or "") for r in results if not r.ok)
    assert [c.status for c in changes] == ["open", "half_open", "closed"]
    assert a.call(svc, {}, ctx(tmp_path)).ok


def test_a_failed_trial_opens_the_breaker_again(server: fakeredis.FakeServer, tmp_path: Path) -> None:
    @tool
    def down() -> dict:
        """Always fails."""
        raise TimeoutError("slow")

    changes: list[Transition] = []
    d = dispatch(server, changes, breaker_failures=1, breaker_cooldown_s=1.0)  # the last refusal lands inside it
    d.call(down, {}, ctx(tmp_path))
    time.sleep(1.05)
    assert d.call(down, {}, ctx(tmp_path)).error_code == ErrorCode.INTERNAL  # the trial
    assert d.call(down, {}, ctx(tmp_path)).error_code == ErrorCode.TOOL_UNAVAILABLE
    assert [c.status for c in changes] == ["open", "half_open", "open"]


def test_failures_of_the_caller_do_not_count_against_the_tool(server: fakeredis.FakeServer, tmp_path: Path) -> None:
    @tool
    def strict(n: int) -> dict:
        """Needs an integer."""
        return {"n": n}

    d = dispatch(server, breaker_failures=1)
    for _ in range(3):
        assert d.call(strict, {"n": "x"}, ctx(tmp_path)).error_code == ErrorCode.INVALID_ARGUMENTS
    assert d.call(strict, {"n": 1}, ctx(tmp_path)).ok


def test_a_read_only_result_is_served_from_the_cache_under_its_canonical_arguments(
        server: fakeredis.FakeServer, tmp_path: Path) -> None:
    entered: list[str] = []

    @tool(read_only=True, cache_ttl_s=60)
    def read(path: str = ".") -> dict:
        """Read."""
        entered.append(path)
        return {"path": path}

    d = dispatch(server)
    first = d.call(read, {}, ctx(tmp_path))
    stored = d.cache.key("read", {"path": "."})
    _eventually(lambda: fakeredis.FakeRedis(server=server).exists(stored))  # written off the call's path
    second = d.call(read, {"path": "."}, ctx(tmp_path))
    assert first.ok and not first.cache_hit and second.cache_hit and second.output == {"path": "."}
    _eventually(lambda: d.status([read])[0]["cache_hits"] == 1)  # counted off the call's path too
    assert entered == ["."]
    assert not d.call(read, {"path": "src"}, ctx(tmp_path)).cache_hit


def _eventually(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.005)


def test_a_locked_resource_is_never_written_twice_at_once(server: fakeredis.FakeServer, tmp_path: Path) -> None:
    intervals: list[tuple[str, float, float]] = []

    @tool(lock="ticket:{ticket_id}", timeout_s=0.5)
    def edit(ticket_id: str) -> dict:
        """Edit."""
        start = time.monotonic()
        time.sleep(0.2)
        intervals.append((ticket_id, start, time.monotonic()))
        return {}

    d = dispatch(server)
    results: list[ToolResult] = []
    calls = [threading.Thread(target=lambda t=t, i=i: results.append(d.call(edit, {"ticket_id": t},
                                                                            step_ctx(tmp_path, f"step-{i}"))))
             for i, t in enumerate(("A", "A", "B"))]
    for c in calls:
        c.start()
    for c in calls:
        c.join()
    assert all(r.ok for r in results)
    a1, a2 = sorted((s, e) for t, s, e in intervals if t == "A")
    assert a1[1] <= a2[0]  # one after the other
    (b,) = [(s, e) for t, s, e in intervals if t == "B"]
    assert b[0] < a1[1]  # another ticket did not wait

    holder = fakeredis.FakeRedis(server=server).lock("t:lock:ticket:C", timeout=10)
    assert holder.acquire()
    busy = d.call(edit, {"ticket_id": "C"}, ctx(tmp_path))
    assert busy.error_code == ErrorCode.TRANSIENT and busy.retryable and "locked by another call" in busy.message


def test_a_step_retried_after_its_worker_died_takes_over_its_own_lock(server: fakeredis.FakeServer) -> None:
    """The dead attempt's lock would keep every call out for its expiry; the same step (same key) may go on."""
    from agentfleet.errors import ToolError
    from agentfleet.fleet.locks import resource_lock

    fleet = fleet_redis(server)
    with resource_lock(fleet, "ticket:D", owner="step-1", wait_s=0.1, hold_s=30) as held:
        held.keep()  # its worker is SIGKILLed mid-call: nothing releases the lock
    with (resource_lock(fleet, "ticket:D", owner="step-1", wait_s=0.1, hold_s=30),
          pytest.raises(ToolError, match="locked by another call"),
          resource_lock(fleet, "ticket:D", owner="step-2", wait_s=0.1, hold_s=30)):
        pass
    assert not fakeredis.FakeRedis(server=server).exists("t:lock:ticket:D")  # released by its owner


def test_without_redis_gates_fail_open_locks_fail_closed_and_the_outage_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dead = FleetRedis(redis.Redis(port=1, socket_connect_timeout=0.2, retry=no_retry()), "t", secret=SECRET,
                      retry_s=0.05)
    d = ToolDispatch(dead, settings(), by="e1", report=lambda t: None)
    entered: list[int] = []

    @tool(read_only=True)
    def free() -> dict:
        """Free."""
        entered.append(1)
        return {}

    @tool(lock="r:{x}")
    def locked(x: str) -> dict:
        """Locked."""
        entered.append(2)
        return {}

    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            assert d.call(free, {}, ctx(tmp_path)).ok
            time.sleep(0.06)
        refused = d.call(locked, {"x": "1"}, ctx(tmp_path))
        assert d.offer([free, locked]).tools == ["free", "locked"]
    assert entered == [1] * 5
    assert refused.error_code == ErrorCode.TRANSIENT and "Redis is unreachable" in (refused.message or "")
    assert sum("Redis unreachable" in r.getMessage() for r in caplog.records) == 1


# -- declarations --------------------------------------------------------------------------

def test_unknown_options_and_wrong_declarations_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option.*permissions"):
        tool(permissions=("fs",))
    with pytest.raises(ConfigurationError, match="tier must be one of"):
        tool(tier="fast")(_described)
    with pytest.raises(ConfigurationError, match="names 'id', which is not one of its arguments"):
        tool(lock="ticket:{id}")(_described)
    with pytest.raises(ConfigurationError, match=r"names .ticket\.x."):
        tool(lock="ticket:{ticket.x}")(_described)
    with pytest.raises(ConfigurationError, match="no health check named 'nope'"):
        tool(health_check="nope")(_described)
    with pytest.raises(ConfigurationError, match="cache_ttl_s is for read_only tools"):
        tool(cache_ttl_s=5)(_described)
    with pytest.raises(ConfigurationError, match="declared twice, differently"):
        health_check("dup-check", ["true"])
        health_check("dup-check", ["false"])
    with pytest.raises(ConfigurationError, match=r"unknown option.*budget"):
        Agent("x", instructions="", model=ScriptedModel([]), goal_schema={}, result_schema={}, budget=3,
              register=False)
    fallback_to_nothing = tool(fallback="elsewhere")(_described)
    with pytest.raises(ConfigurationError, match="falls back to 'elsewhere'"):
        Agent("x", instructions="", model=ScriptedModel([]), goal_schema={}, result_schema={},
              tools=[fallback_to_nothing], register=False)


def test_a_second_agent_with_the_same_name_is_refused() -> None:
    first = Agent("twin-agent", instructions="", model=ScriptedModel([]), goal_schema={}, result_schema={})
    with pytest.raises(ConfigurationError, match="declared twice"):
        Agent("twin-agent", instructions="", model=ScriptedModel([]), goal_schema={}, result_schema={})
    from agentfleet.agents.registry import registry

    assert registry.get("twin-agent") is first


def test_a_shared_check_is_declared_once_and_named_by_tools() -> None:
    shared = health_check("node-runtime", ["node", "--version"], tier="local")
    a = tool(name="js_a", health_check="node-runtime")(_described)
    b = tool(name="js_b", health_check="node-runtime")(_described)
    assert a.health_check is b.health_check is shared and shared.target == ("node", "--version")


def test_a_tier_sets_the_timeout_and_timeout_s_overrides_it() -> None:
    s = settings()
    assert tool(tier="http")(_described).effective_timeout_s(s) == 3.0
    assert tool(tier="http", timeout_s=7)(_described).effective_timeout_s(s) == 7.0
    assert tool(_described).effective_timeout_s(s) == s.tool_timeout_s
    assert settings(tier_http_s=9).tier_timeout_s("http") == 9.0


def _described(ticket_id: str = "t") -> dict:
    """A tool."""
    return {}


def test_a_redis_that_answers_with_errors_counts_as_away(tmp_path: Path) -> None:
    class OutOfMemory(fakeredis.FakeRedis):
        def execute_command(self, *args: object, **options: object) -> object:
            raise redis.exceptions.ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    d = ToolDispatch(FleetRedis(OutOfMemory(), "t", secret=SECRET), settings(), by="e1", report=lambda t: None)

    @tool(read_only=True)
    def still_works() -> dict:
        """Works."""
        return {"fine": True}

    assert d.call(still_works, {}, ctx(tmp_path)).output == {"fine": True}
    assert d.offer([still_works]).tools == ["still_works"] and not d.redis.available


def test_a_stale_read_never_revives_a_breaker_another_trial_has_closed(server: fakeredis.FakeServer) -> None:
    from agentfleet.fleet.breaker import Breaker

    changes: list[Transition] = []
    breaker = Breaker(fleet_redis(server), settings(), by="e1", report=changes.append)
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    opened = BreakerEntry("open", time.time() - 100, 5)
    client.set(breaker.key("svc"), sealed(breaker.key("svc"), opened))
    first = breaker.claim_trial("svc", opened, 5)
    late = breaker.claim_trial("svc", opened, 5)  # read the same open breaker, claims after the first
    assert first.token and not late.admitted
    breaker.record("svc", ToolResult(ok=True), trial=first)
    stale = breaker.claim_trial("svc", opened, 5)  # read before the trial closed it
    assert stale.admitted and stale.token is None  # an ordinary call: the breaker stays closed
    breaker.record("svc", ToolResult(ok=True), trial=first)  # a trial ends once
    assert client.get(breaker.key("svc")) is None
    assert [c.status for c in changes] == ["half_open", "closed"]


def test_the_planner_reuses_good_news_briefly_and_reads_bad_news_every_time(server: fakeredis.FakeServer) -> None:
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    down = sealed("t:health:p", HealthEntry("down", "refused", time.time(), "e2"))
    primary, backup = _tool_with(HealthCheck("p", lambda: None), "p"), _tool_with(HealthCheck("b", lambda: None), "b")
    clock = [100.0]  # the window turns when the test says so, not when a busy machine gets round to it
    planner = ToolDispatch(fleet_redis(server), settings(gate_view_s=0.3), by="e1", report=lambda t: None,
                           clock=lambda: clock[0])
    assert planner.offer([primary, backup]).tools == ["p", "b"]
    client.set("t:health:p", down)
    clock[0] += 0.29
    assert planner.offer([primary, backup]).tools == ["p", "b"]  # an all-healthy view, reused briefly
    clock[0] += 0.02
    assert planner.offer([primary, backup]).tools == ["b"]
    client.delete("t:health:p")
    assert planner.offer([primary, backup]).tools == ["p", "b"]  # bad news is never reused
    assert dispatch(server, gate_view_s=0).offer([primary, backup]).tools == ["p", "b"]


def test_a_trial_whose_caller_died_is_taken_over_once_its_claim_expires(server: fakeredis.FakeServer) -> None:
    from agentfleet.fleet.breaker import Breaker

    breaker = Breaker(fleet_redis(server), settings(), "e1", lambda t: None)
    opened = BreakerEntry("open", time.time() - 100, 5)
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    client.set(breaker.key("svc"), sealed(breaker.key("svc"), opened))
    died = breaker.claim_trial("svc", opened, 0.2)  # its executor is SIGKILLed mid-call: nothing ends the trial
    half = BreakerEntry.loads(breaker.redis.unseal(breaker.key("svc"), fakeredis.FakeRedis(
        server=server, decode_responses=True).get(breaker.key("svc"))))
    assert died.token and half is not None and half.state == "half_open"
    assert not breaker.claim_trial("svc", half, 5).admitted
    time.sleep(0.25)
    taken = breaker.claim_trial("svc", half, 5)
    assert taken.token
    breaker.record("svc", ToolResult(ok=True), trial=taken)
    assert fakeredis.FakeRedis(server=server).get(breaker.key("svc")) is None


def test_a_down_entry_is_refreshed_before_it_expires_so_it_never_reads_as_unknown(
        server: fakeredis.FakeServer) -> None:
    """A lapse between expiry and the next check would offer a down tool as 'unknown' (healthy) meanwhile."""

    def check() -> None:
        raise ConnectionError("refused")

    plans = plan_checks([_tool_with(HealthCheck("svc", check, ttl_s=0.2, down_ttl_s=0.2), "a")])
    cache = HealthCache(fleet_redis(server), settings(health_tick_s=0.02), "e1", lambda t: None)
    cache.check_due(plans)
    reader = fakeredis.FakeRedis(server=server, decode_responses=True)
    stop = time.monotonic() + 1.0
    ticker = threading.Thread(target=_tick_until, args=(cache, plans, stop, 0.02))
    ticker.start()
    lapses = 0
    while time.monotonic() < stop:
        lapses += reader.get("t:health:a") is None
        time.sleep(0.002)
    ticker.join()
    assert lapses == 0


def test_a_re_run_plan_step_offers_what_its_first_attempt_offered() -> None:
    """The offer is the plan step's recorded input: a planner that died mid-call and is re-run shows the model
    the tools its first attempt saw, not what health says now."""
    from agentfleet.fleet.gate import Offer
    from agentfleet.roles.planner import _checkpointed_offer

    now = Offer(["primary", "other"])
    recorded = {"tools": ["backup", "other"], "notice": "Tools unavailable now: primary (down)."}
    assert _checkpointed_offer(recorded, now) == Offer(["backup", "other"], "Tools unavailable now: primary (down).")
    assert _checkpointed_offer(None, now) == now  # a step recorded before offers were stored


def test_waiting_for_a_busy_lock_is_not_held_against_the_tool(server: fakeredis.FakeServer, tmp_path: Path) -> None:
    """Contention on a popular resource must not open the breaker and take the tool away from everyone."""
    @tool(lock="ticket:{ticket_id}", timeout_s=0.2)
    def edit(ticket_id: str) -> dict:
        """Edit."""
        return {"ticket_id": ticket_id}

    d = dispatch(server, breaker_failures=1)
    holder = fakeredis.FakeRedis(server=server).lock("t:lock:ticket:E", timeout=30)
    assert holder.acquire()
    assert d.call(edit, {"ticket_id": "E"}, ctx(tmp_path)).error_code == ErrorCode.TRANSIENT
    assert d.call(edit, {"ticket_id": "F"}, ctx(tmp_path)).ok  # not refused as TOOL_UNAVAILABLE


def test_a_trial_that_cannot_get_its_lock_leaves_the_trial_to_the_next_call(
        server: fakeredis.FakeServer, tmp_path: Path) -> None:
    @tool(lock="ticket:{ticket_id}", timeout_s=0.2)
    def edit(ticket_id: str) -> dict:
        """Edit."""
        return {"ticket_id": ticket_id}

    changes: list[Transition] = []
    d = dispatch(server, changes)
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    client.set("t:breaker:edit", sealed("t:breaker:edit", BreakerEntry("open", time.time() - 100, 5)))
    holder = fakeredis.FakeRedis(server=server).lock("t:lock:ticket:G", timeout=30)
    assert holder.acquire()
    assert d.call(edit, {"ticket_id": "G"}, ctx(tmp_path)).error_code == ErrorCode.TRANSIENT  # the tool never ran
    assert d.call(edit, {"ticket_id": "H"}, step_ctx(tmp_path, "k2")).ok  # the next call is the trial
    assert [c.status for c in changes] == ["half_open", "closed"]


def test_a_command_check_that_floods_its_output_costs_bounded_memory() -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    flood = run_check(HealthCheck("yes", ("yes",)), 1.0)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert not flood.healthy and grown_mib < 50, grown_mib
    talkative = run_check(HealthCheck("sh", ("sh", "-c", "echo first; seq 1 200000; echo last >&2")), 10)
    assert talkative.healthy and talkative.detail == "first"


def test_a_hung_check_is_not_started_again_while_its_last_run_still_hangs() -> None:
    release = threading.Event()
    starts: list[int] = []

    def hangs() -> None:
        starts.append(1)
        release.wait(30)

    check = HealthCheck("hangs", hangs)
    threads = threading.active_count()
    for _ in range(5):
        outcome = run_check(check, 0.05)
        assert not outcome.healthy
    assert starts == [1] and threading.active_count() == threads + 1, "one abandoned thread, not one per run"
    assert "still running" in (outcome.detail or "")
    release.set()  # the hung run ends: the next check runs the function again
    time.sleep(0.05)
    assert run_check(check, 0.05).healthy and len(starts) == 2
