"""The Celery app the worker tests run in real ``celery worker`` subprocesses.

Configured from the environment (the test harness sets these):
``CS_BROKER_URL``, ``CS_REDIS_URL`` (semaphores and the event log), ``CS_LIMIT``,
``CS_LEASE``, ``CS_QUEUE_LIMITS`` (JSON), ``CS_EXTRA_CONF`` (JSON of more settings;
``task_queues`` as ``[[queue, direct exchange, routing key], ...]``).
Every task body appends ``{"id", "task", "tag", "event", "at", "pid", "retries"}``
records to the Redis list ``events``, so a test sees from outside who ran when.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject
from kombu import Exchange, Queue

from celery_semaphore import (
    Concurrency,
    LimitedTask,
    Rate,
    RateLimited,
    Semaphore,
    install,
    parking_lists,
    per_key,
)
from celery_semaphore.limits import declared

BROKER = os.environ.get("CS_BROKER_URL", "redis://127.0.0.1:6399/0")
REDIS_URL = os.environ.get("CS_REDIS_URL", BROKER)
LIMIT = int(os.environ.get("CS_LIMIT", "2"))


def extra_conf(text: str) -> dict[str, Any]:
    """The settings ``CS_EXTRA_CONF`` holds, with ``task_queues`` made into kombu Queues."""
    conf: dict[str, Any] = json.loads(text)
    if "task_queues" in conf:
        conf["task_queues"] = [
            Queue(name, Exchange(exchange, type="direct"), routing_key=key)
            for name, exchange, key in conf["task_queues"]
        ]
    return conf


app = Celery("limited_app", broker=BROKER, backend=REDIS_URL)
app.conf.update(
    {
        "semaphore_redis_url": REDIS_URL,
        "semaphore_lease_timeout": float(os.environ.get("CS_LEASE", "60")),
        "semaphore_queue_limits": json.loads(os.environ.get("CS_QUEUE_LIMITS", "{}")),
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": "default",
        "result_expires": 600,
        **extra_conf(os.environ.get("CS_EXTRA_CONF", "{}")),
    }
)
install(app)
_log = redis.Redis.from_url(REDIS_URL)
if os.environ.get("CS_STUCK_AFTER"):  # sooner than 30 s: a stopped move is put back
    parking_lists.STUCK_AFTER = float(os.environ["CS_STUCK_AFTER"])


def record(task: Any, event: str, tag: Any = None, **more: Any) -> None:
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
                **more,
            }
        ),
    )


_readers: dict[str, Semaphore] = {}


def granted_at(task: Any, name: str, limit: int | None = None, rate: str | None = None) -> float:
    """When the running task's permit of ``name`` was granted (the Redis server's time),
    read where the app keeps its semaphores."""
    if name not in _readers:
        conf = task.app.conf
        namespace = conf.get("semaphore_namespace") or "celery_semaphore"
        _readers[name] = Semaphore(
            conf.semaphore_redis_url, name, limit, rate=rate, namespace=namespace
        )
    holders = _readers[name].status().holders
    return next(h.acquired_at for h in holders if h.holder == task.request.id)


def _held(task: Any, seconds: float, tag: Any) -> Any:
    record(task, "start", tag)
    time.sleep(seconds)
    record(task, "end", tag)
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def hold(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def hold_until_opened(self: Any, tag: str, give_up: float = 60.0) -> Any:
    """Holds its permit until the test sets the key ``open:<tag>`` (or ``give_up`` s
    pass), so a test decides when each body ends, not a sleep."""
    record(self, "start", tag)
    deadline = time.monotonic() + give_up
    while not _log.exists(f"open:{tag}") and time.monotonic() < deadline:
        time.sleep(0.02)
    record(self, "end", tag)
    return tag


@app.task(
    bind=True,
    base=LimitedTask,
    semaphore="hold",
    limit=LIMIT,
    acks_late=True,
    reject_on_worker_lost=True,
)
def hold_late(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="wide", limit=3)
def wide(self: Any, seconds: float, tag: Any = None) -> Any:
    """Like ``hold``, with a limit of 3 whatever ``CS_LIMIT`` says."""
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="wide", limit=3, acks_late=True,
          reject_on_worker_lost=True)  # fmt: skip
def wide_late(self: Any, seconds: float, tag: Any = None) -> Any:
    """Like ``hold_late``, with a limit of 3 whatever ``CS_LIMIT`` says."""
    return _held(self, seconds, tag)


@app.task(
    bind=True,
    base=LimitedTask,
    limit=1,
    semaphore=lambda customer, *_, **__: f"customer-{customer}",
)
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


# -- tasks of test_task_options / test_brokers_canvas ---------------------------------------


def _key_of(mode: str, *_: Any, **__: Any) -> Any:
    if mode == "raise":
        raise LookupError("no key for this mode")
    if mode == "int":
        return 5
    return f"keyed-{mode}"


@app.task(bind=True, base=LimitedTask, semaphore=_key_of, limit=1)
def keyed(self: Any, mode: str) -> Any:
    """Its semaphore comes from a key function that raises or returns an int on demand."""
    record(self, "start", mode)
    record(self, "end", mode)
    return mode


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def limited_add(self: Any, x: int, y: int, seconds: float = 0.1) -> int:
    """x + y, holding a permit of "hold" for ``seconds`` (for chains, groups and chords)."""
    record(self, "start", [x, y])
    time.sleep(seconds)
    record(self, "end", [x, y])
    return x + y


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def limited_sum(self: Any, values: list[int]) -> int:
    """A chord callback that also needs a permit of "hold"."""
    record(self, "start", "sum")
    record(self, "end", "sum")
    return sum(values)


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT, max_retries=3,
          semaphore_max_wait_time=3.0)  # fmt: skip
def flaky_budget(self: Any, fail_times: int) -> Any:
    """``flaky`` with a 3 s wait budget (test_waiting: each wait period has its own)."""
    record(self, "start", self.request.retries)
    if self.request.retries < fail_times:
        raise self.retry(countdown=0.05, exc=RuntimeError("flaky"))
    record(self, "end", self.request.retries)
    return self.request.retries


@app.task(bind=True, base=LimitedTask, semaphore="hold", limit=LIMIT)
def request_seen(self: Any, tag: Any = None) -> dict[str, Any]:
    """What this execution's request carried (test_handover: a message parked at
    publish is published as the producer would have sent it)."""
    record(self, "start", tag)
    request = self.request
    seen = {
        "tag": tag,
        "header": request.get("x-test"),
        "parent_id": request.parent_id,
        "root_id": request.root_id,
        "expires": request.expires,
        "retries": request.retries,
        "priority": (request.delivery_info or {}).get("priority"),
    }
    record(self, "end", tag)
    return seen


@app.task(bind=True)
def spawn_request_seen(self: Any, tag: Any) -> str:
    """Publishes ``request_seen`` from inside a task (its parent and root ids are ours)."""
    return str(request_seen.delay(tag).id)


# -- per-task wait modes (test_handover_steering) -----------------------------------------


@app.task(bind=True, base=LimitedTask, semaphore="own-mode", limit=1,
          semaphore_wait_mode="handover")  # fmt: skip
def parks_in_any_app(self: Any, seconds: float, tag: Any = None) -> Any:
    """Waits in handover mode whatever the app's ``semaphore_wait_mode``."""
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="own-mode", limit=1,
          semaphore_wait_mode="countdown")  # fmt: skip
def counts_down_in_any_app(self: Any, seconds: float, tag: Any = None) -> Any:
    """Waits in countdown mode whatever the app's ``semaphore_wait_mode``."""
    return _held(self, seconds, tag)


def declare_limit(limit: int) -> None:
    """The limit the "hold" tasks declare in this process. The test process imports
    this module once per session (celery_harness.py), with the first cluster's
    CS_LIMIT; each cluster sets its own here, as its workers declare it: a publisher
    declaring another limit is judged by its own (effective_limit() in common_meta.lua)."""
    for task in app.tasks.values():
        if inspect.getattr_static(task, "semaphore", None) == "hold":
            task.limit = limit
            task.declared_limits = declared(task)


# -- tasks of test_rates ----------------------------------------------------------------


@app.task(bind=True, base=LimitedTask, semaphore="paced", rate="20/s")
def paced(self: Any, seconds: float, tag: Any = None) -> Any:
    """At most 20 starts a second, no cap on how many run at once (handover mode)."""
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="paced-countdown", rate="20/s",
          semaphore_wait_mode="countdown")  # fmt: skip
def paced_countdown(self: Any, seconds: float, tag: Any = None) -> Any:
    """Like ``paced``, in countdown mode, on a semaphore of its own."""
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, limits=[Concurrency("both", 3), Rate("both", 10)])
def both(self: Any, seconds: float, tag: Any = None) -> Any:
    """At most 3 at once and 10 starts a second, granted in one step."""
    return _held(self, seconds, tag)


WEIGHED = [Concurrency("weighed", 4, weight=lambda weight, *_, **__: weight)]


@app.task(bind=True, base=LimitedTask, limits=WEIGHED)
def weighed(self: Any, weight: int, seconds: float, tag: Any = None) -> Any:
    """Takes ``weight`` of the 4 permits of "weighed" (the tag carries the weight)."""
    return _held(self, seconds, tag)


BATCHES = [Rate("batches", 10, burst=3, weight=lambda rows, *_, **__: rows)]


@app.task(bind=True, base=LimitedTask, limits=BATCHES)
def batch(self: Any, rows: int, seconds: float, tag: Any = None) -> Any:
    """A call that counts as ``rows`` of the 10 starts a second (burst 3)."""
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, limits=[Concurrency("pair-a", 2), Concurrency("pair-b", 2)])
def pair(self: Any, seconds: float, tag: Any = None) -> Any:
    """Needs a permit of "pair-a" and one of "pair-b", in one step. Its start says
    when each was granted (``granted``, the Redis server's time)."""
    granted = {name: granted_at(self, name, limit=2) for name in ("pair-a", "pair-b")}
    record(self, "start", tag, granted=granted)
    time.sleep(seconds)
    record(self, "end", tag)
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="pair-b", limit=2)
def b_only(self: Any, seconds: float, tag: Any = None) -> Any:
    """Holds one of "pair-b"'s permits only."""
    return _held(self, seconds, tag)


ACCOUNT = per_key("account", lambda account, *_, **__: f"account-{account}")


@app.task(bind=True, base=LimitedTask, max_retries=0, limits=[Rate(ACCOUNT, 5)])
def per_account(self: Any, account: str, seconds: float, tag: Any = None) -> Any:
    """At most 5 starts a second per account."""
    return _held(self, seconds, tag)


def _slow_down(task: Any, tag: Any, retry_after: float, hold: float = 0.0) -> Any:
    """Raises RateLimited(retry_after) on its first run (a 429 from the partner).
    Its start says when its permit was granted (``granted``, the Redis server's
    time): a body may begin well after its grant on a loaded machine."""
    granted = granted_at(task, task.semaphore, task.limit, task.rate)
    record(task, "start", tag, granted=granted)
    if retry_after and _log.set(f"slowed:{task.request.id}", 1, nx=True):
        time.sleep(hold)
        record(task, "rate-limited", tag)
        raise RateLimited(retry_after=retry_after)
    record(task, "end", tag)
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="paced", rate="20/s", max_retries=0)
def slow_down(self: Any, tag: Any, retry_after: float) -> Any:
    return _slow_down(self, tag, retry_after)


@app.task(bind=True, base=LimitedTask, semaphore="paced-countdown", rate="20/s", max_retries=0,
          semaphore_wait_mode="countdown")  # fmt: skip
def slow_down_countdown(self: Any, tag: Any, retry_after: float) -> Any:
    return _slow_down(self, tag, retry_after)


@app.task(bind=True, base=LimitedTask, semaphore="paced-capped", limit=1, rate="1000/s",
          max_retries=0)  # fmt: skip
def slow_down_capped(self: Any, tag: Any, retry_after: float) -> Any:
    """One at a time, 1000/s: only the release of the one permit grants the next
    task. It holds a while before it raises, so the next one comes to wait in place
    (a release grants an in-place waiter its permit directly)."""
    return _slow_down(self, tag, retry_after, hold=0.3)


@app.task(bind=True, base=LimitedTask, max_retries=0,
          limits=[Rate("named-a", 20), Rate("named-b", 20)])  # fmt: skip
def slow_down_named(self: Any, tag: Any, retry_after: float) -> Any:
    """Raises RateLimited(retry_after, limit="named-a") once: only that rate pauses."""
    record(self, "start", tag)
    if _log.set(f"slowed:{self.request.id}", 1, nx=True):
        record(self, "rate-limited", tag)
        raise RateLimited(retry_after, limit="named-a")
    record(self, "end", tag)
    return tag


@app.task(bind=True, base=LimitedTask, semaphore="named-a", rate="20/s")
def named_a(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="named-b", rate="20/s")
def named_b(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="named-b", rate="20/s", max_retries=0)
def slow_down_misnamed(self: Any) -> Any:
    """Names a rate it does not declare: a mistake, the task fails saying so."""
    raise RateLimited(1.0, limit="named-z")


@app.task(bind=True, base=LimitedTask, semaphore="unrated", limit=2, max_retries=0)
def slow_down_unrated(self: Any) -> Any:
    """Declares no rate at all, and raises RateLimited: the task fails saying so."""
    raise RateLimited(1.0)


SHADOWED = [Concurrency("shadowed", 1, shadow=True), Rate("shadowed", 5, shadow=True)]


@app.task(bind=True, base=LimitedTask, limits=SHADOWED)
def shadowed(self: Any, seconds: float, tag: Any = None) -> Any:
    """Limits tried in shadow: they refuse nothing and count what they would have."""
    return _held(self, seconds, tag)


@app.task(
    bind=True,
    base=LimitedTask,
    limits=[Concurrency("half-shadowed", 1, shadow=True), Rate("half-shadowed", 10)],
)
def half_shadowed(self: Any, seconds: float, tag: Any = None) -> Any:
    """A concurrency limit tried in shadow beside an enforced rate."""
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="paced-short", rate="20/s", max_retries=0,
          semaphore_backoff_max=0.5)  # fmt: skip
def slow_down_long(self: Any, tag: Any, retry_after: float) -> Any:
    """A pause longer than its backoff_max: it comes back early and waits in its place."""
    return _slow_down(self, tag, retry_after)


# -- fair share and priority (test_fair_in_workers) ------------------------------------


def _account(account: str, *_: Any, **__: Any) -> str:
    return account


def _gold_first(account: str) -> int:
    return 3 if account == "gold" else 1


@app.task(bind=True, base=LimitedTask, semaphore="fair-api", limit=2, fair_by=_account)
def fair_call(self: Any, account: str, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="fair-api-countdown", limit=2,
          fair_by=_account, semaphore_wait_mode="countdown")  # fmt: skip
def fair_call_countdown(self: Any, account: str, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, limits=[
    Rate("fair-paced", 20, fair_by=_account, fair_weights=_gold_first),
])  # fmt: skip
def fair_paced(self: Any, account: str, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="fair-broken", limit=1,
          fair_by=lambda account, **_: {}[account])  # fmt: skip
def fair_broken(self: Any, account: str) -> Any:
    return account


@app.task(bind=True, base=LimitedTask, semaphore="prio", limit=1)
def prioritized(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="prio-countdown", limit=1,
          semaphore_wait_mode="countdown")  # fmt: skip
def prioritized_countdown(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, semaphore="fair-capped", limit=2, fair_by=_account,
          max_per_key=1)  # fmt: skip
def fair_capped(self: Any, account: str, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


@app.task(bind=True, base=LimitedTask, limits=[
    Concurrency("fair-joint", 2, fair_by=_account), Concurrency("joint-other", 3),
])  # fmt: skip
def fair_joint(self: Any, account: str, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)


# A cap and a rate on different names: two gates (one slot with a hash-tagged namespace)
APART = [Concurrency("apart-cap", 2), Rate("apart-rate", 5)]


@app.task(bind=True, base=LimitedTask, limits=APART)
def capped_and_paced(self: Any, seconds: float, tag: Any = None) -> Any:
    return _held(self, seconds, tag)
