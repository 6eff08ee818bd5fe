"""The README's quick start as a new user writes it: a LimitedTask and nothing else
(no ``install(app)``), so the plugin binds only when the worker finalizes the app,
after the command line was parsed. ``CS_BROKER_URL``: the broker (a Redis one is
also the semaphores' Redis, as the README's default); ``CS_CONF``: JSON of more
settings (test_worker_options: settings that look right and are not)."""

from __future__ import annotations

import json
import os

from celery import Celery

from celery_semaphore import LimitedTask

app = Celery(
    "quickstart_app", broker=os.environ["CS_BROKER_URL"], backend=os.environ["CS_BROKER_URL"]
)
app.conf.broker_connection_retry_on_startup = True
app.conf.update(json.loads(os.environ.get("CS_CONF", "{}")))


@app.task(base=LimitedTask, semaphore="partner-api", limit=int(os.environ.get("CS_LIMIT", "5")))
def call_partner(order_id: int) -> int:
    return order_id
