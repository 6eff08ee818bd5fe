"""The example's Celery app: ``celery -A example_project.tasks worker -Q default,reports``.

Three kinds of work, three kinds of cap, all enforced across every worker of the cluster:

- ``call_partner(order_id)``: calls the partner API (:mod:`example_project.downstream`),
  which answers 429 when more than 5 requests are in flight. A :class:`LimitedTask` with
  ``semaphore="partner-api", limit=5``: at most 5 run at once, in the order they were sent.
- ``sync_customer(customer_id, amount)``: a read-modify-write of the customer's record
  (a Redis hash standing in for a CRM that has no transactions). Its semaphore is a function
  of the arguments, ``customer-<id>``, with ``limit=1``: syncs of one customer never overlap
  (so no update is lost), while different customers sync in parallel.
- ``build_report(n)``: a plain ``@app.task`` routed to the ``reports`` queue, capped by
  ``semaphore_queue_limits = {"reports": 2}`` (every task consumed from that queue shares the
  cap; :func:`celery_semaphore.install` enables it for plain tasks).

Environment (read at import, so set it before starting workers):

- ``DEMO_REDIS_URL`` (``redis://127.0.0.1:6379/0``): broker, result backend, semaphores and the
  records below;
- ``DEMO_BROKER_URL`` (empty: the Redis): the broker, if another one (RabbitMQ: amqp://...);
- ``DEMO_DOWNSTREAM_URL`` (``http://127.0.0.1:8000``): the partner API;
- ``DEMO_PARTNER_LIMIT`` (5): the partner-api cap; set it above the partner's capacity to see
  what the cap prevents (429s);
- ``DEMO_DISABLE_PREFETCH`` (1): ``worker_disable_prefetch``; 0 lets the workers prefetch
  (``worker_prefetch_multiplier`` messages per process).

Every task body appends ``start`` and ``end`` records (JSON) to the Redis list ``demo:events``;
the demo's report is computed from them. Every execution (from the moment a worker process
takes the task until it lets it go: a wait in place for a permit, or being parked, included)
appends one record to ``demo:executions``, so the report can tell when every worker process was
busy.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import task_postrun, task_prerun

import celery_semaphore
from celery_semaphore import LimitedTask

REDIS_URL = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get("DEMO_BROKER_URL") or REDIS_URL
DOWNSTREAM_URL = os.environ.get("DEMO_DOWNSTREAM_URL", "http://127.0.0.1:8000").rstrip("/")
PARTNER_LIMIT = int(os.environ.get("DEMO_PARTNER_LIMIT", "5"))
DISABLE_PREFETCH = os.environ.get("DEMO_DISABLE_PREFETCH", "1") != "0"
REPORTS_LIMIT = 2
CUSTOMER_LIMIT = 1

KEY_PREFIX = "demo:"  # every key the example writes itself starts with this
EVENTS = KEY_PREFIX + "events"
ENDED = KEY_PREFIX + "ended"
EXECUTIONS = KEY_PREFIX + "executions"
CRM = KEY_PREFIX + "crm:"
CRM_ROUND_TRIP = (0.1, 0.2)  # seconds between reading and writing a customer record
REPORT_SECONDS = (0.2, 0.4)

app = Celery("example_project", broker=BROKER_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue="default",
    task_routes={"example_project.tasks.build_report": {"queue": "reports"}},
    semaphore_redis_url=REDIS_URL,
    broker_connection_retry_on_startup=True,
    result_expires=3600,
    worker_hijack_root_logger=False,
    # A worker takes a message only when one of its processes is free (Celery >= 5.6, Redis
    # broker; the multiplier then changes nothing). With prefetch, a call handed a permit could
    # wait at a worker whose processes all ran calls, up to a whole call, while its permit
    # idled and the calls behind it waited in place at the other worker (README: "Prefetch";
    # DEMO_DISABLE_PREFETCH=0, or demo --prefetch-multiplier N, lets the workers prefetch).
    worker_disable_prefetch=DISABLE_PREFETCH,
    worker_prefetch_multiplier=1,
)
app.conf.semaphore_queue_limits = {"reports": REPORTS_LIMIT}
celery_semaphore.install(app)  # queue caps on plain tasks need the worker bootstep

_client: redis.Redis | None = None


def store() -> redis.Redis:
    """This process's client for the records (redis-py reconnects after a fork)."""
    global _client  # noqa: PLW0603 - one client per process, made on first use
    if _client is None:
        _client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    return _client


class PartnerBusy(Exception):
    """The partner API answered 429 Too Many Requests."""


def waits_of(task: Task) -> int:
    """How many times this execution waited for a permit (retried later) before it ran."""
    return int((getattr(task.request, "celery_semaphore", None) or {}).get("waits", 0))


def _record(task: Task, event: str, key: Any, **fields: Any) -> None:
    record = {
        "task": task.name.rsplit(".", 1)[-1],
        "id": task.request.id,
        "key": key,
        "event": event,
        "at": time.time(),
        "waits": waits_of(task),
        "retries": task.request.retries,
        "worker": task.request.hostname,
        "pid": os.getpid(),
        **fields,
    }
    pipe = store().pipeline(transaction=False)
    pipe.rpush(EVENTS, json.dumps(record))
    if event == "end":
        pipe.incr(ENDED)
    pipe.execute()


_taken_at: dict[str, float] = {}  # task id -> when this process took it (task_prerun)


@task_prerun.connect
def _taken(task_id: str, task: Task, **_: Any) -> None:
    if task.app is app:
        _taken_at[task_id] = time.time()


@task_postrun.connect
def _let_go(task_id: str, task: Task, state: str | None = None, **_: Any) -> None:
    """One record per execution: the process was busy with the task from ``taken`` to
    ``at``, whether its body ran (``state`` SUCCESS or FAILURE) or it waited for a permit in
    place and was parked (RETRY)."""
    taken = _taken_at.pop(task_id, None)
    if taken is None:
        return
    record = {
        "task": task.name.rsplit(".", 1)[-1],
        "id": task_id,
        "taken": taken,
        "at": time.time(),
        "state": state,
        "worker": task.request.hostname,
        "pid": os.getpid(),
    }
    store().rpush(EXECUTIONS, json.dumps(record))


@contextmanager
def recorded(task: Task, key: Any) -> Iterator[None]:
    """Record the body's start and end (with how it ended)."""
    _record(task, "start", key)
    error: str | None = None
    try:
        yield
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        _record(task, "end", key, ok=error is None, error=error)


@app.task(bind=True, base=LimitedTask, semaphore="partner-api", limit=PARTNER_LIMIT)
def call_partner(self: Task, order_id: int) -> dict[str, Any]:
    """Send one order to the partner; at most PARTNER_LIMIT of these run at once, cluster-wide."""
    with recorded(self, order_id):
        request = urllib.request.Request(
            f"{DOWNSTREAM_URL}/orders/{order_id}",
            data=json.dumps({"order_id": order_id}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                reply: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 429:
                raise PartnerBusy(f"order {order_id}: 429 Too Many Requests") from None
            raise
        return reply


@app.task(
    bind=True,
    base=LimitedTask,
    semaphore=lambda customer_id, *a, **k: f"customer-{customer_id}",
    limit=CUSTOMER_LIMIT,
)
def sync_customer(self: Task, customer_id: int, amount: int = 1) -> int:
    """Add ``amount`` to the customer's balance: read, talk to the CRM, write back.

    Not atomic on purpose (the CRM has no transactions): two syncs of one customer at once
    would lose an update. The per-customer semaphore (limit 1) makes them take turns.
    """
    with recorded(self, customer_id):
        key = f"{CRM}{customer_id}"
        balance = int(store().hget(key, "balance") or 0)
        time.sleep(random.uniform(*CRM_ROUND_TRIP))
        store().hset(key, mapping={"balance": balance + amount, "synced_by": socket.gethostname()})
        return balance + amount


@app.task(bind=True)
def build_report(self: Task, n: int) -> dict[str, Any]:
    """A heavy report (plain task): the ``reports`` queue lets 2 run at once, cluster-wide."""
    with recorded(self, n):
        time.sleep(random.uniform(*REPORT_SECONDS))  # the slow query
        checksum = sum(i * i for i in range(n * 1000)) % 1_000_003
        return {"n": n, "checksum": checksum}
