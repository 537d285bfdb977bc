"""What handlers need, built once per process: settings, agents, store, publisher, the tool dispatch."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import Celery

from agentfleet import constants as C
from agentfleet.agents.registry import Agent, AgentRegistry, fleet_agents
from agentfleet.config.settings import Settings
from agentfleet.events.publisher import Publisher
from agentfleet.events.topology import Topology
from agentfleet.fleet.dispatch import ToolDispatch
from agentfleet.fleet.fleet_redis import FleetRedis, connect
from agentfleet.fleet.stops import RunStops
from agentfleet.hooks.base import Hooks
from agentfleet.hooks.loading import build_hooks
from agentfleet.models.base import Model
from agentfleet.models.ratelimit import rate_limited
from agentfleet.redaction import install_for
from agentfleet.roles.health import announcer
from agentfleet.roles.runs_left import RunsLeft
from agentfleet.store.db import make_engine
from agentfleet.store.repository import Store

SETTINGS_KEY = "agentfleet_settings"
PREFLIGHT_DONE_KEY = "agentfleet_preflight_done"  # set by `agentfleet worker`, which checks before Celery starts
_lock = threading.Lock()


@dataclass
class Runtime:
    settings: Settings
    topology: Topology
    store: Store
    publisher: Publisher
    agents: AgentRegistry
    redis: FleetRedis
    dispatch: ToolDispatch
    hooks: Hooks
    stops: RunStops
    runs_left: RunsLeft = field(default_factory=RunsLeft)  # the runs as this process's last commits left them
    # Role -> this process's token, for each role it has a queue of its own for (``Topology.own_queue``): the events it
    # sends carry it, and the next event of each run comes back here, where the run as it left it is kept.
    tokens: dict[str, str] = field(default_factory=dict)

    def agent(self, name: str) -> Agent | None:
        return self.agents.get(name)

    def close(self) -> None:
        """Let go of the connections this runtime pooled (the database's, Redis's, and the broker's its publisher kept),
        once its workers have stopped: a process that runs fleets one after another (a test suite, an app embedding
        one) must not keep each one's. Used again, each reconnects. A database in SQLite's memory lives in its one
        connection: kept."""
        url = self.store.engine.url
        if url.get_backend_name() != "sqlite" or url.database not in (None, "", ":memory:"):
            self.store.engine.dispose()
        self.redis.client.close()
        self.publisher.close()


def settings_of(app: Celery) -> Settings:
    return app.conf[SETTINGS_KEY]


def runtime_for(app: Celery) -> Runtime:
    """The app's runtime, created on first use (workers connect lazily, after fork)."""
    existing = getattr(app, "_agentfleet_runtime", None)
    if existing is not None:
        return existing
    with _lock:
        existing = getattr(app, "_agentfleet_runtime", None)
        if existing is None:
            settings = settings_of(app)
            settings.workspace.mkdir(parents=True, exist_ok=True)  # the default is a folder of its own
            install_for(settings)  # what this process logs, publishes publicly and shows is masked from now on
            agents = fleet_agents(settings, wrap=_rate_limit(settings))
            topology = Topology(settings.namespace, tool_queues=agents.tool_queues(), affinity=not settings.embedded)
            publisher = Publisher(app, topology)
            hooks = build_hooks(settings)
            store = Store(make_engine(settings.effective_database_url), hooks=hooks, audit=settings.audit)
            redis = FleetRedis(connect(settings), settings.namespace, secret=lambda: fleet_key(settings, store))
            existing = Runtime(
                settings=settings,
                topology=topology,
                store=store,
                publisher=publisher,
                agents=agents,
                redis=redis,
                dispatch=ToolDispatch(redis, settings, by=f"{socket.gethostname()}:{os.getpid()}",
                                      report=announcer(publisher)),
                hooks=hooks,
                stops=RunStops(redis),
            )
            app._agentfleet_runtime = existing  # type: ignore[attr-defined]
    return existing


def fleet_key(settings: Settings, store: Store) -> bytes:
    """The key sealing what the fleet writes to Redis: the setting, or the one kept in the database."""
    if settings.fleet_key is not None:
        return settings.fleet_key.get_secret_value().encode()
    return store.fleet_secret(C.FLEET_KEY_SECRET).encode()


def _rate_limit(settings: Settings) -> Callable[[Model], Model] | None:
    """The wrapper giving models their share of the fleet-wide rate limit, when any is set."""
    if not settings.model_rate_limits:
        return None
    uri = "memory://" if settings.embedded else settings.redis_url
    return rate_limited(settings.model_rate_limits, uri, C.redis_key(settings.namespace, C.RATE_LIMIT_KEY))


def close_runtime(app: Celery) -> None:
    """``Runtime.close`` for the app's runtime, if one was made (a fleet stopped before it got that far has none)."""
    existing = getattr(app, "_agentfleet_runtime", None)
    if existing is not None:
        existing.close()


def share_runtime(app: Celery, runtime: Runtime) -> None:
    """Make ``app`` use an existing runtime (embedded mode: several apps, one store)."""
    app._agentfleet_runtime = runtime  # type: ignore[attr-defined]
