"""Bare Celery: three chained no-op tasks on three queues, the floor for three hops on this broker."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

BROKER = os.environ.get("AGENTFLEET_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS = os.environ.get("AGENTFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("floor", broker=BROKER)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_ignore_result=True,
                broker_transport_options={"confirm_publish": True}, worker_hijack_root_logger=False)
_redis = redis.Redis.from_url(REDIS)


@app.task(name="floor.hop1")
def hop1(t0: float, key: str) -> None:
    hop2.apply_async((t0, key), queue="floor.q2")


@app.task(name="floor.hop2")
def hop2(t0: float, key: str) -> None:
    hop3.apply_async((t0, key), queue="floor.q3")


@app.task(name="floor.hop3")
def hop3(t0: float, key: str) -> None:
    _redis.rpush(key, time.time() - t0)
