"""The Celery app. ``celery -A agentfleet.workers.app worker -Q agentfleet.executor`` works as is."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.signals import setup_logging
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Message

from agentfleet import constants as C
from agentfleet import logs
from agentfleet.config.settings import Settings, get_settings
from agentfleet.events.topology import Topology
from agentfleet.events.wire import install_bounded_decompression
from agentfleet.redaction import install_for
from agentfleet.roles.runtime import SETTINGS_KEY
from agentfleet.workers.bootsteps import (
    ApprovalTimer,
    DeclareTopology,
    HealthTimer,
    InboxConsumer,
    MetricsServer,
    Preflight,
    RetentionTimer,
    ScheduleTimer,
    SweepTimer,
    WakeOnShutdown,
)
from agentfleet.workers.event_task import register_tasks
from agentfleet.workers.roles import pool_implementation

# Celery task time limits stay below RabbitMQ's consumer_timeout (30 min).
TASK_SOFT_TIME_LIMIT_S = 15 * 60
TASK_TIME_LIMIT_S = 20 * 60


log = logging.getLogger(__name__)


class FleetConsumer(CeleryConsumer):
    """Celery's consumer, except that a message it cannot decode is kept, not acked away.

    Celery acks (drops) a message whose body it cannot decode; rejecting it instead hands it
    to the queue's dead-letter exchange, where ``agentfleet dlq`` shows it with the broker's reason.
    """

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        log.error("undecodable message dead-lettered: %s", exc,
                  extra={"content_type": message.content_type, "routing_key": (message.delivery_info or {})
                         .get("routing_key")})
        message.reject(requeue=False)


def celery_config(settings: Settings) -> dict[str, Any]:
    """Every Celery setting the fleet relies on, with why, in one place."""
    topology = Topology(settings.namespace)
    transport_options: dict[str, Any] = (
        {"polling_interval": settings.embedded_polling_interval_s}
        if settings.embedded
        else {"confirm_publish": True}
    )
    return {
        SETTINGS_KEY: settings,
        "broker_url": settings.effective_broker_url,
        "broker_transport_options": transport_options,
        "broker_connection_retry_on_startup": True,
        # After losing the broker, a worker reconnects by itself (Celery's consumer blueprint restarts),
        # up to 100 tries with growing waits: long enough to ride out a RabbitMQ restart or upgrade.
        # Tasks in hand when the connection went are redelivered by the broker: their acks are lost.
        "broker_connection_retry": True,
        "broker_connection_max_retries": 100,
        # After a broker restart Celery lowers the prefetch count and restores it from inside an
        # ack; on a py-amqp channel shared by pool threads that blocked the planner for minutes
        # (celery/celery#9512). Prefetch is 1 anyway: nothing to reduce.
        "worker_enable_prefetch_count_reduction": False,
        "worker_consumer": f"{__name__}:FleetConsumer",
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_queues": list(topology.role_queues.values()),
        "task_default_queue": topology.role_queues[C.PLANNER].name,
        "task_create_missing_queues": False,
        # Durability: ack after the work, redeliver when a worker dies, hold one message at a time.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": False,  # a task that fails for good is dead-lettered, not dropped
        "worker_prefetch_multiplier": 1,
        # Below RabbitMQ's consumer_timeout (30 min), after which it closes a channel holding an
        # unacked message. Enforced by the prefork pool; in the thread pool each tool has its own
        # timeout and retries wait in the broker (countdowns of seconds), never in a worker.
        "task_soft_time_limit": TASK_SOFT_TIME_LIMIT_S,
        "task_time_limit": TASK_TIME_LIMIT_S,
        # The resizable thread pool, also for plain `celery -A agentfleet.workers.app worker` (whose
        # default `--pool prefork` defers to this setting, as Celery documents).
        "worker_pool": pool_implementation("threads"),
        # Flower sees the real work once it watches: it switches task events on in every worker (they cost three
        # messages a step when nobody listens). AGENTFLEET_TASK_EVENTS=true sends them always.
        "worker_send_task_events": settings.task_events,
        # A namespace isolates the control plane too: `inspect`, `control`, `agentfleet scale` and Flower
        # in one namespace see and touch only its workers, however many namespaces share the broker.
        "control_exchange": topology.control,
        "event_exchange": topology.celery_events,
        "event_queue_prefix": topology.celery_events,
        "task_send_sent_event": settings.task_events,
        "worker_hijack_root_logger": False,
        # A task whose broker connection is lost cannot ack any more: its message is redelivered,
        # so stop it rather than finish work someone else is about to do again.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
    }


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    install_bounded_decompression(settings.max_decompressed_bytes)
    app = Celery("agentfleet", set_as_current=False)
    app.conf.update(celery_config(settings))
    register_tasks(app)
    app.steps["worker"].add(Preflight)
    app.steps["worker"].add(DeclareTopology)
    app.steps["worker"].add(MetricsServer)
    app.steps["worker"].add(SweepTimer)
    app.steps["worker"].add(HealthTimer)
    app.steps["worker"].add(ApprovalTimer)
    app.steps["worker"].add(RetentionTimer)
    app.steps["worker"].add(ScheduleTimer)
    app.steps["consumer"].add(InboxConsumer)
    app.steps["consumer"].add(WakeOnShutdown)
    return app


def add_tool_queues(app: Celery, namespace: str, names: Iterable[str]) -> list[str]:
    """Let this app's worker consume these dedicated tool queues (``@tool(queue=...)``); their full names. The
    Celery app knows only the role queues until told: no agent code is needed to start a worker."""
    queues = [Topology(namespace).tool_queue(n) for n in names]
    app.conf.task_queues = [*app.conf.task_queues, *queues]
    return [q.name for q in queues]


@setup_logging.connect
def _configure_logging(loglevel: Any = None, **_: Any) -> None:
    settings = get_settings()
    install_for(settings)
    logs.configure(settings.log_level if loglevel is None else loglevel, settings.log_json)


app = create_app()
