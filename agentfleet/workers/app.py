"""The Celery app. ``celery -A agentfleet.workers.app worker -Q agentfleet.executor`` works as is."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import setup_logging

from agentfleet import constants as C
from agentfleet import logs
from agentfleet.config.settings import Settings, get_settings
from agentfleet.events.topology import Topology
from agentfleet.tasks.catalog import register_tasks
from agentfleet.tasks.runtime import SETTINGS_KEY
from agentfleet.workers.bootsteps import DeclareTopology, InboxConsumer


def celery_config(settings: Settings) -> dict[str, Any]:
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
        "task_soft_time_limit": C.TASK_SOFT_TIME_LIMIT_S,
        "task_time_limit": C.TASK_TIME_LIMIT_S,
        # Flower sees the real work.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
    }


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("agentfleet", set_as_current=False)
    app.conf.update(celery_config(settings))
    register_tasks(app)
    app.steps["worker"].add(DeclareTopology)
    app.steps["consumer"].add(InboxConsumer)
    return app


@setup_logging.connect
def _configure_logging(loglevel: Any = None, **_: Any) -> None:
    settings = get_settings()
    logs.configure(settings.log_level if loglevel is None else loglevel, settings.log_json)


app = create_app()
