"""The Celery app the worker tests run in real ``celery worker`` subprocesses.

Configured from the environment (the test harness sets these):
``CS_BROKER_URL``, ``CS_REDIS_URL`` (semaphores and the event log), ``CS_LIMIT``,
``CS_LEASE``, ``CS_QUEUE_LIMITS`` (JSON), ``CS_EXTRA_CONF`` (JSON of more settings).
Every task body appends ``{"id", "task", "tag", "event", "at", "pid", "retries"}``
records to the Redis list ``events``, so a test sees from outside who ran when.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject

from celery_semaphore import LimitedTask, install

BROKER = os.environ.get("CS_BROKER_URL", "redis://127.0.0.1:6399/0")
REDIS_URL = os.environ.get("CS_REDIS_URL", BROKER)
LIMIT = int(os.environ.get("CS_LIMIT", "2"))

app = Celery("limited_app", broker=BROKER, backend=REDIS_URL)
app.conf.update(
    semaphore_redis_url=REDIS_URL,
    semaphore_lease_timeout=float(os.environ.get("CS_LEASE", "60")),
    semaphore_queue_limits=json.loads(os.environ.get("CS_QUEUE_LIMITS", "{}")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue="default",
    result_expires=600,
    **json.loads(os.environ.get("CS_EXTRA_CONF", "{}")),
)
install(app)
_log = redis.Redis.from_url(REDIS_URL)


def record(task: Any, event: str, tag: Any = None) -> None:
    _log.rpush(
        "events",
        json.dumps(
            {
                "id": task.request.id,
                "task": task.name,
                "tag": tag,
                "event": event,
                "at": time.time(),
                "pid": os.getpid(),
                "retries": task.request.retries,
            }
        ),
    )


def _held(task: Any, seconds: float, tag: Any) -> Any:
    record(task, "start", tag)
    time.sleep(seconds)
    record(task, "end", tag)
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def hold(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT, acks_late=True,
          reject_on_worker_lost=True)
def hold_late(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, limit=1,
          semaphore=lambda customer, *_, **__: f"customer-{customer}")
def per_customer(self: Any, customer: str, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True)
def plain(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def ending(self: Any, how: str, seconds: float = 0.0) -> Any:
    """Ends the way ``how`` says, after holding ``seconds``."""
    record(self, "start", how)
    time.sleep(seconds)
    if how == "fail":
        raise RuntimeError("failing on purpose")
    if how == "ignore":
        raise Ignore()
    if how == "reject":
        raise Reject("rejecting on purpose", requeue=False)
    if how == "retry_once" and self.request.retries == 0:
        raise self.retry(countdown=0.1, max_retries=1)
    record(self, "end", how)
    return how


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT, max_retries=3)
def flaky(self: Any, fail_times: int) -> Any:
    """Fails ``fail_times`` times, retrying itself; records its own retry count."""
    record(self, "start", self.request.retries)
    if self.request.retries < fail_times:
        raise self.retry(countdown=0.05, exc=RuntimeError("flaky"))
    record(self, "end", self.request.retries)
    return self.request.retries
