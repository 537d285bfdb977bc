"""The live fleet over Celery's remote control: who is up, in which role, with what pool; resize a role.

Everything goes through the namespace's own control exchange (app.py), so one
namespace's commands never reach another's workers. Sizes are what each worker
reports, read again after a change: what is printed is confirmed, not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery import Celery

from agentfleet import constants as C
from agentfleet.errors import AgentfleetError
from agentfleet.events.topology import Topology


@dataclass(frozen=True)
class LiveWorker:
    name: str
    roles: tuple[str, ...]
    pool: str  # the pool class, short
    size: int
    active: int
    autoscale: dict[str, int] | None  # {"max", "min"} when the worker autoscales
    tool_queues: tuple[str, ...] = ()  # the dedicated tool queues it consumes (``--queues``), by short name


@dataclass(frozen=True)
class Resized:
    name: str
    before: int
    after: int | None  # None: the worker did not answer the second look
    answer: str


def live_workers(app: Celery, topology: Topology, timeout_s: float = 2.0) -> list[LiveWorker]:
    """Every worker of the namespace that answers within ``timeout_s``, by name.

    A broadcast has no count of who will answer, so Celery waits out the timeout: the first question (stats) does,
    and the two after it are put to the workers that answered it alone, and return once each has answered (what
    made ``workers`` and ``scale`` wait three timeouts a look)."""
    stats: dict[str, Any] = app.control.inspect(timeout=timeout_s).stats() or {}
    queues: dict[str, Any] = {}
    active: dict[str, Any] = {}
    if stats:
        known = app.control.inspect(destination=sorted(stats), timeout=timeout_s, limit=len(stats))
        queues = known.active_queues() or {}
        active = known.active() or {}
    role_of = {q.name: role for role, q in topology.role_queues.items()}
    dedicated = C.tool_queue_name(topology.namespace, "")
    found = []
    for name, info in sorted(stats.items()):
        pool = info.get("pool") or {}
        scaler = info.get("autoscaler")
        consumed = [str(q.get("name")) for q in queues.get(name) or []]
        tool_queues = tuple(sorted(q[len(dedicated):] for q in consumed if q.startswith(dedicated)))
        roles = {role_of[q] for q in consumed if q in role_of} | ({C.EXECUTOR} if tool_queues else set())
        found.append(LiveWorker(
            name=name,
            roles=tuple(sorted(roles)),
            tool_queues=tool_queues,
            pool=str(pool.get("implementation", "?")).rsplit(":", 1)[-1].rsplit(".", 1)[-1],
            size=int(pool.get("max-concurrency") or 0),
            active=len(active.get(name) or []),
            autoscale={"max": int(scaler["max"]), "min": int(scaler["min"])} if scaler else None,
        ))
    return found


def tool_queues_view(app: Celery, topology: Topology, workers: list[LiveWorker], declared: tuple[str, ...] = ()
                     ) -> dict[str, dict[str, int]]:
    """Each dedicated tool queue the live workers consume or the loaded agents name: ready messages, consumers.
    One with calls waiting and no consumer is what an operator looks for: those calls end at their deadline."""
    from agentfleet.events.publisher import tool_queue_status

    names = sorted({q for w in workers for q in w.tool_queues} | set(declared))
    status = tool_queue_status(app, topology, names)
    return {n: {"ready": status[n][0], "consumers": status[n][1]} for n in names if n in status}


def spread(total: int, count: int) -> list[int]:
    """``total`` threads over ``count`` workers as evenly as can be (the first get the remainder)."""
    base, extra = divmod(total, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def scale(app: Celery, topology: Topology, role: str, total: int, timeout_s: float = 2.0) -> list[Resized]:
    """Set the pool size summed over ``role``'s live workers to ``total``, spread evenly."""
    workers = [w for w in live_workers(app, topology, timeout_s) if role in w.roles]
    if not workers:
        raise AgentfleetError(f"no live {role} worker answers in namespace {topology.namespace!r}")
    if total < len(workers):
        raise AgentfleetError(f"{total} is fewer than the {len(workers)} live {role} workers (each keeps at least "
                              "one thread); stop workers to go lower")
    answers: dict[str, str] = {}
    for worker, target in zip(workers, spread(total, len(workers)), strict=True):
        answers[worker.name] = _resize(app, worker, target, timeout_s)
    after = {w.name: w.size for w in live_workers(app, topology, timeout_s)}
    return [Resized(w.name, w.size, after.get(w.name), answers[w.name]) for w in workers]


def _resize(app: Celery, worker: LiveWorker, target: int, timeout_s: float) -> str:
    where = {"destination": [worker.name], "reply": True, "timeout": timeout_s}
    if worker.autoscale is not None:  # Celery refuses pool_grow there: move the autoscaler's ceiling
        replies = app.control.autoscale(target, min(worker.autoscale["min"], target), **where)
    elif target > worker.size:
        replies = app.control.pool_grow(target - worker.size, **where)
    elif target < worker.size:
        replies = app.control.pool_shrink(worker.size - target, **where)
    else:
        return "unchanged"
    answer = next((r[worker.name] for r in replies or [] if worker.name in r), None)
    if not answer:
        return "no answer"
    return str(answer.get("ok") or answer.get("error") or answer)
