"""limited_app plus the tasks and hooks of the endings and heartbeat tests.

Run a worker with ``app="endings_app"``; the test process imports this module
too, so these tasks are registered on the same client app. Besides the
``events`` records of limited_app, every process of the worker appends the
signals it sends to the Redis list ``signals`` (JSON ``{"kind", "pid", "at",
...}``): ``permit_lost`` and ``permit_released`` of celery_semaphore, and
Celery's ``task_failure`` (with ``context``: whether ``sender.request`` was
the failed task's, i.e. the handler could tell which request failed),
``task_retry`` (with ``einfo``: False for the cold-shutdown cancel) and
``task_revoked`` (with ``terminated``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import limited_app
from celery.signals import task_failure, task_retry, task_revoked
from limited_app import LIMIT, app, ending, hold, hold_late, plain, record

from celery_semaphore import LimitedTask
from celery_semaphore.signals import permit_lost, permit_released

__all__ = ["app", "ending", "hold", "hold_late", "plain"]

if os.environ.get("CS_STEP_AFTER_POOL"):
    # Celery's bootstep order between the semaphore step and the Pool step is
    # arbitrary (a topological sort over hashed classes); force the order in
    # which the step is stopped before the pool drains on warm shutdown.
    from celery_semaphore.worker.bootstep import SemaphoreStep

    SemaphoreStep.requires = (*SemaphoreStep.requires, "celery.worker.components:Pool")


def _sleep(task: Any, seconds: float, tag: Any) -> Any:
    record(task, "start", tag)
    time.sleep(seconds)
    record(task, "end", tag)
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT, soft_time_limit=0.5)
def soft_limited(self: Any, seconds: float) -> Any:
    """Outlives its soft time limit and catches nothing (SoftTimeLimitExceeded ends it)."""
    return _sleep(self, seconds, "soft")


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT, time_limit=1.0)
def hard_limited(self: Any, seconds: float) -> Any:
    """Outlives its hard time limit: the pool kills the child running it."""
    return _sleep(self, seconds, "hard")


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT, max_retries=1)
def retry_later(self: Any, countdown: float) -> Any:
    """Retries itself once after ``countdown`` s, so the gap between its runs is visible."""
    record(self, "start", self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=countdown)
    record(self, "end", self.request.retries)
    return self.request.retries


def _note(kind: str, **fields: Any) -> None:
    """Append ``{"kind", "pid", "at", **fields}`` to the Redis list ``signals``."""
    entry = {"kind": kind, "pid": os.getpid(), "at": time.time(), **fields}
    limited_app._log.rpush("signals", json.dumps(entry, default=repr))


@permit_lost.connect
def _record_lost(sender: Any = None, **fields: Any) -> None:
    _note("permit_lost", semaphore=fields.get("semaphore"), task_id=fields.get("task_id"),
          task_name=fields.get("task_name"))  # fmt: skip


@permit_released.connect
def _record_released(sender: Any = None, **fields: Any) -> None:
    _note("permit_released", semaphore=fields.get("semaphore"), task_id=fields.get("task_id"),
          released=fields.get("released"))  # fmt: skip


@task_failure.connect
def _record_failure(
    sender: Any = None, task_id: Any = None, exception: Any = None, **_: Any
) -> None:
    context = getattr(sender, "request", None)
    _note("task_failure", task_id=task_id, exception=type(exception).__name__,
          context=getattr(context, "id", None) == task_id)  # fmt: skip


@task_retry.connect
def _record_retry(sender: Any = None, request: Any = None, einfo: Any = None, **_: Any) -> None:
    _note("task_retry", task_id=getattr(request, "id", None), einfo=einfo is not None)


@task_revoked.connect
def _record_revoked(
    sender: Any = None, request: Any = None, terminated: Any = None, **_: Any
) -> None:
    _note("task_revoked", task_id=getattr(request, "id", None), terminated=bool(terminated))
