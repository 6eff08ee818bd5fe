"""App for the "Redis unreachable" tests: its semaphores live on ``CS_SEMAPHORE_REDIS_URL``.

The broker, the results and the ``events`` log stay on the cluster's live
Redis (``CS_BROKER_URL`` / ``CS_REDIS_URL``), so only the semaphore's Redis
is down. One task per ``semaphore_on_redis_error`` policy; they consume the
queue ``policy``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_semaphore import LimitedTask

BROKER = os.environ["CS_BROKER_URL"]
STATE_URL = os.environ["CS_REDIS_URL"]

app = Celery("policy_app", broker=BROKER, backend=STATE_URL)
app.conf.update(
    semaphore_redis_url=os.environ.get("CS_SEMAPHORE_REDIS_URL", STATE_URL),
    semaphore_backoff_base=0.1,
    semaphore_backoff_max=0.3,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue="policy",
    result_expires=600,
)
_log = redis.Redis.from_url(STATE_URL)


def _run(task: Any, tag: Any) -> Any:
    request = task.request
    for event in ("start", "end"):
        record = {"id": request.id, "task": task.name, "tag": tag, "event": event,
                  "at": time.time(), "pid": os.getpid(), "retries": request.retries}  # fmt: skip
        _log.rpush("events", json.dumps(record))
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="guarded", limit=1)
def guarded_retry(self: Any, tag: Any) -> Any:
    """Default policy "retry": never runs without a permit."""
    return _run(self, tag)


@app.task(bind=True, base=LimitedTask, semaphore="guarded", limit=1,
          semaphore_on_redis_error="fail")  # fmt: skip
def guarded_fail(self: Any, tag: Any) -> Any:
    return _run(self, tag)


@app.task(bind=True, base=LimitedTask, semaphore="guarded", limit=1,
          semaphore_on_redis_error="run")  # fmt: skip
def guarded_run(self: Any, tag: Any) -> Any:
    return _run(self, tag)


@app.task(bind=True, base=LimitedTask, semaphore="guarded", limit=1, semaphore_max_waits=2)
def guarded_budget(self: Any, tag: Any) -> Any:
    """Policy "retry" with a budget of 2 waits: with Redis down, SemaphoreTimeout."""
    return _run(self, tag)
