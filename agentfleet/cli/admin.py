"""``agentfleet namespace`` and ``agentfleet db``: a namespace's broker and Redis state, the schema."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from agentfleet.config.settings import Settings, get_settings

if TYPE_CHECKING:
    pass
from agentfleet.cli.app import db_app, ns_app
from agentfleet.cli.common import out


@ns_app.command("delete")
def namespace_delete(
    namespace: Annotated[str, typer.Argument(help="The namespace (AGENTFLEET_NAMESPACE of its fleet)")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Delete a namespace's queues and exchanges (with what they hold) and its Redis keys.

    Its runs stay in the database, which namespaces share. Stop its workers first: a live
    worker declares everything again when it restarts."""
    from kombu import Connection
    from pydantic import ValidationError

    from agentfleet.events.topology import Topology
    from agentfleet.fleet.fleet_redis import connect, forget_namespace
    from agentfleet.workers.preflight import reach_all

    try:  # the name is checked as AGENTFLEET_NAMESPACE is
        settings = Settings(namespace=namespace)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="NAMESPACE") from None
    from agentfleet.cli.workers import _declared_tool_queues

    topology = Topology(namespace, tool_queues=_declared_tool_queues())  # those the agents here name
    names = [q.name for q in topology.all_queues()] + [e.name for e in
                                                       (*topology.all_exchanges(), *topology.celery_exchanges())]
    if not yes:
        typer.confirm(f"delete {len(names)} queues and exchanges of namespace {namespace!r} (and what the queues "
                      f"hold), and its Redis keys?", abort=True)
    reach_all(settings, "broker", "redis")
    with Connection(settings.broker_url) as conn:
        topology.delete(conn)
    forgotten = forget_namespace(connect(settings), namespace) if not settings.embedded else 0
    out.print(f"deleted namespace {namespace}: {', '.join(names)}; {forgotten} Redis keys", soft_wrap=True,
              markup=False, highlight=False)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision")] = "head") -> None:
    """Create or migrate the tables (Alembic)."""
    from agentfleet.redaction import redact
    from agentfleet.store import db

    settings: Settings = get_settings()
    db.upgrade(settings.effective_database_url, revision)
    out.print(f"database at {revision}: {redact(settings.effective_database_url)}")
