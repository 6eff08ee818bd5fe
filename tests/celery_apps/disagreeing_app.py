"""Two tasks that declare one semaphore with different limits (5 and 3), and a third
that agrees with itself: the worker warns about the first two at start."""

from __future__ import annotations

import os

from celery import Celery

from celery_semaphore import LimitedTask

app = Celery("disagreeing_app", broker=os.environ["CS_BROKER_URL"])
app.conf.update(semaphore_redis_url=os.environ["CS_REDIS_URL"])
app.conf.broker_connection_retry_on_startup = True


@app.task(base=LimitedTask, semaphore="partner-api", limit=5)
def sync_orders() -> None: ...


@app.task(base=LimitedTask, semaphore="partner-api", limit=3)
def sync_invoices() -> None: ...


@app.task(base=LimitedTask, semaphore="reports", limit=2)
def report() -> None: ...
