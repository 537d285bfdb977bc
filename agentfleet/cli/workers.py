"""The fleet's processes: ``worker``, ``workers``, ``scale``, ``flower``."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentfleet import constants as C
from agentfleet.config.settings import get_settings

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import app
from agentfleet.cli.common import err, out


@app.command()
def worker(
    role: Annotated[str, typer.Argument(help="planner | executor | observer")],
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Pool size")] = None,
    pool: Annotated[str | None, typer.Option(help="threads (resizable, the default) | prefork | solo")] = None,
    autoscale: Annotated[str | None, typer.Option(
        help="MAX,MIN: grow and shrink the pool with the load (instead of --concurrency)")] = None,
    loglevel: Annotated[str | None, typer.Option(help="Log level")] = None,
    hostname: Annotated[str | None, typer.Option(help="Celery node name (default role.pid@host)")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        help="Serve Prometheus metrics on this port (0: any free port; default AGENTFLEET_METRICS_PORT)")] = None,
    queues: Annotated[str | None, typer.Option(
        "--queues", help="Executors: the dedicated tool queues to consume instead of the role's own, comma-separated "
                         "(gpu: tools declared with queue='gpu'; default: the executor queue)")] = None,
) -> None:
    """Start one role's Celery worker against the distributed fleet."""
    from agentfleet.workers.roles import ROLES, pool_implementation, worker_argv

    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}")
    settings = get_settings()
    if metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": metrics_port})
    chosen_pool = pool or ROLES[role].default_pool
    if settings.metrics_port is not None and chosen_pool == "prefork":
        from agentfleet.hooks.metrics_dir import use_multiprocess_metrics

        use_multiprocess_metrics(role)  # before anything imports prometheus-client (workers.app does)

    from agentfleet.redaction import install_for
    from agentfleet.roles.runtime import PREFLIGHT_DONE_KEY
    from agentfleet.workers.app import create_app
    from agentfleet.workers.bootsteps import FreezeStartupHeap
    from agentfleet.workers.preflight import preflight

    install_for(settings)  # the preflight's messages are masked too
    preflight(settings)  # ConfigurationError: main() prints it and exits 2, before anything is consumed
    if role == C.EXECUTOR:  # what this host offers to bound each sandboxed call: found (and logged) before work
        from agentfleet.sandbox.call_bounds import host_bounds

        host_bounds()
    celery_app = create_app(settings)
    celery_app.conf[PREFLIGHT_DONE_KEY] = True
    celery_app.conf.worker_pool = pool_implementation(chosen_pool)
    celery_app.steps["consumer"].add(FreezeStartupHeap)  # a process of its own: not an embedding program's heap
    consumed = _queues(celery_app, settings.namespace, role, queues)
    argv = worker_argv(ROLES[role], settings.namespace, concurrency=concurrency, autoscale=autoscale,
                       loglevel=loglevel or settings.log_level,
                       hostname=hostname or f"{role}.{os.getpid()}@%h", queues=consumed)
    celery_app.worker_main(argv)


def _queues(celery_app: Any, namespace: str, role: str, given: str | None) -> list[str] | None:
    """The full names of the queues ``--queues`` asks for (None: the role's own)."""
    if given is None:
        return None
    if role != C.EXECUTOR:
        raise typer.BadParameter("only executors consume dedicated tool queues", param_hint="--queues")
    from agentfleet.tools.options import TOOL_QUEUE_NAME
    from agentfleet.workers.app import add_tool_queues
    from agentfleet.workers.roles import ROLES

    names = [n.strip() for n in given.split(",") if n.strip()]
    bad = [n for n in names if n != C.DEFAULT_TOOL_QUEUE and not TOOL_QUEUE_NAME.fullmatch(n)]
    if not names or bad:
        raise typer.BadParameter(f"queue names are lowercase letters, digits, '_' or '-' ({', '.join(bad) or 'none'})",
                                 param_hint="--queues")
    dedicated = [n for n in names if n != C.DEFAULT_TOOL_QUEUE]
    own = [ROLES[role].queue(namespace)] if C.DEFAULT_TOOL_QUEUE in names else []
    return own + add_tool_queues(celery_app, namespace, dedicated)


def _declared_tool_queues() -> tuple[str, ...]:
    """The dedicated queues the configured agents' tools name, when their code is here (it need not be)."""
    try:
        from agentfleet.agents.registry import fleet_agents

        return fleet_agents(get_settings()).tool_queues()
    except Exception:
        return ()


def _control_plane() -> tuple[Any, Any]:
    """The namespace's Celery app and topology, once the broker answers."""
    from agentfleet.events.topology import Topology
    from agentfleet.workers.app import create_app
    from agentfleet.workers.preflight import reach_all

    settings = get_settings()
    reach_all(settings, "broker")
    return create_app(settings), Topology(settings.namespace)


@app.command()
def workers(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for workers to answer")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """The namespace's live workers by role: pool and size, tasks running now, and each role queue's depth."""
    import dataclasses

    from agentfleet.events.publisher import queue_depths
    from agentfleet.ops.control import live_workers, tool_queues_view

    celery_app, topology = _control_plane()
    found = live_workers(celery_app, topology, timeout)
    depths = queue_depths(celery_app, topology)
    dedicated = tool_queues_view(celery_app, topology, found, _declared_tool_queues())
    if as_json:
        print(json.dumps({"workers": [dataclasses.asdict(w) for w in found], "queue_depths": depths,
                          "tool_queues": dedicated}))
        return
    for role in C.ROLES:
        mine = [w for w in found if role in w.roles]
        out.print(f"{role}: {len(mine)} worker(s), {sum(w.size for w in mine)} threads, queue depth "
                  f"{depths.get(role, '?')}", soft_wrap=True, highlight=False)
        for w in mine:
            scaling = f" autoscale {w.autoscale['min']}..{w.autoscale['max']}" if w.autoscale else ""
            queues = f" queues={','.join(w.tool_queues)}" if w.tool_queues else ""
            out.print(f"  {w.name}  pool={w.pool} size={w.size}{scaling} active={w.active}{queues}", soft_wrap=True,
                      markup=False, highlight=False)
        if role == C.EXECUTOR:
            for name, seen in dedicated.items():
                warn = "  NO CONSUMER: its calls are refused TOOL_UNAVAILABLE" if not seen["consumers"] else ""
                out.print(f"  tool queue {name}: {seen['consumers']} consumer(s), depth {seen['ready']}{warn}",
                          soft_wrap=True, markup=False, highlight=False)


@app.command()
def scale(
    role: Annotated[str, typer.Argument(help="planner | executor | observer")],
    total: Annotated[int, typer.Argument(help="Threads in all, over the role's live workers")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each answer")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Set a role's total pool size across its live workers, live (spread evenly); prints what each confirmed."""
    import dataclasses

    from agentfleet.ops.actions import scale_role, trail, who

    if role not in C.ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(C.ROLES)}")
    if total < 1:
        raise typer.BadParameter("at least 1")
    celery_app, topology = _control_plane()
    done = scale_role(celery_app, topology, role, total, by=who(None), via="cli", store=trail(get_settings()),
                      timeout_s=timeout)
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in done]))
    else:
        for r in done:
            out.print(f"{r.name}: {r.before} → {r.after if r.after is not None else '?'} ({r.answer})",
                      soft_wrap=True, markup=False, highlight=False)
    if any(r.after is None for r in done):
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="HTTP port")] = 5555,
    address: Annotated[str, typer.Option(help="Bind address")] = "127.0.0.1",
    unauthenticated_api: Annotated[
        bool, typer.Option("--unauthenticated-api", help="Serve Flower's HTTP API without auth (local use only)")
    ] = False,
) -> None:
    """Start Flower against the configured broker (extra options pass through to Flower)."""
    from agentfleet.workers.app import create_app

    if unauthenticated_api:
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    celery_app = create_app(get_settings())
    try:  # what is running now shows its tasks at once; Flower itself enables workers that come later
        celery_app.control.enable_events()
    except Exception as exc:  # the broker is away: Flower reports that itself
        err.print(f"could not switch task events on yet: {exc}")
    celery_app.start(["flower", f"--port={port}", f"--address={address}", *ctx.args])
