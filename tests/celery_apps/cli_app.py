"""A minimal app for invoking the real ``celery semaphore`` CLI (CS_REDIS_URL from the env).

It declares the semaphore ``launch-api`` (limit 5) and ``mail-api`` (a rate of 30/m,
no limit), never used by the tests unless they say so, a per-key family ``customer``
(``customer-<id>``), and a queue cap and rate on ``reports`` (limit 2, 10/m): the names
the CLI knows from the app alone.
``CS_CLI_CONF`` (JSON) adds settings, for tests of wrong ones.
"""

import json
import os

from celery import Celery

from celery_semaphore import LimitedTask, per_key

app = Celery("cli_app", broker="memory://")
app.conf.semaphore_redis_url = os.environ["CS_REDIS_URL"]
app.conf.semaphore_queue_limits = {"reports": 2}
app.conf.semaphore_queue_rates = {"reports": "10/m"}
app.conf.update(json.loads(os.environ.get("CS_CLI_CONF", "{}")))


@app.task(base=LimitedTask, semaphore="launch-api", limit=5)
def call_launch_api() -> None: ...


@app.task(base=LimitedTask, semaphore="mail-api", rate="30/m")
def send_mail() -> None: ...


@app.task(
    base=LimitedTask,
    semaphore=per_key("customer", lambda customer, **_: f"customer-{customer}"),
    limit=1,
)
def sync_customer(customer: str) -> None: ...
