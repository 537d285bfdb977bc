"""Role definitions: which queue a role consumes and how its pool is sized by default.

Pools are thread pools by default: measured on 2 cores, Celery's thread pool ran
a 3-queue chain 1.3–1.8× faster than prefork, and our handlers spend their time
waiting on the model, the tool or the database. ``threads`` is the fleet's own
resizable thread pool (workers/pool.py), so worker counts scale live.
``--pool prefork`` isolates crashes per child where a tool is not trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentfleet import constants as C


@dataclass(frozen=True)
class Role:
    name: str
    default_concurrency: int
    default_pool: str = "threads"

    def queue(self, namespace: str) -> str:
        return C.queue_name(namespace, self.name)


ROLES: dict[str, Role] = {
    C.PLANNER: Role(C.PLANNER, default_concurrency=4),
    C.EXECUTOR: Role(C.EXECUTOR, default_concurrency=8),
    C.OBSERVER: Role(C.OBSERVER, default_concurrency=4),
}


RESIZABLE_THREADS = "agentfleet.workers.pool:ResizableThreadPool"


def pool_implementation(pool: str) -> str:
    """What Celery's ``worker_pool`` is set to for a pool name: ``threads`` is the fleet's resizable one."""
    return RESIZABLE_THREADS if pool == "threads" else pool


def worker_argv(role: Role, namespace: str, *, concurrency: int | None, loglevel: str,
                hostname: str | None = None, autoscale: str | None = None,
                queues: list[str] | None = None) -> list[str]:
    """The ``celery worker`` arguments that start one role.

    ``queues``: the full names of the queues it consumes (default: the role's own).
    No ``--pool``: Celery's option accepts only its own pool names, so the pool is the
    app's ``worker_pool`` setting (``pool_implementation``), which Celery uses when none is given.
    """
    return [
        "worker",
        "--queues", ",".join(queues or [role.queue(namespace)]),
        "--hostname", hostname or f"{role.name}@%h",
        *(["--autoscale", autoscale] if autoscale else ["--concurrency", str(concurrency or role.default_concurrency)]),
        "--loglevel", loglevel,
        "--without-mingle",
        "--without-gossip",
    ]
