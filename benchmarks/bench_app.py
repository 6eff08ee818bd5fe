"""The Celery app of ``bench_celery.py``, run by real ``celery worker`` processes.

Configured from the environment (``bench_celery.py`` sets these before it
imports this module and before it starts the workers):

- ``BENCH_BROKER_URL``: broker, and the semaphores' Redis (the default
  ``semaphore_redis_url`` is the broker's URL);
- ``BENCH_SEMAPHORE_URL``: ``semaphore_redis_url`` (``semaphore_url``'s older name,
  read the same way; older packages know only it), when set (not empty): a Redis of
  its own beside a RabbitMQ or a Redis broker (``bench_celery.py --broker``), or a
  ``postgresql://`` URL (``--semaphore-store postgres``);
- ``BENCH_QUEUE``: the default queue (``bench``); ``<queue>-plain`` is the plain
  tasks' (a name unique to the run on a shared broker);
- ``BENCH_CONTROL_EXCHANGE``: ``control_exchange``, when set (unique to the run on a
  shared broker: no other workers answer our ``inspect``, ours answer no one else's);
- ``BENCH_DECLARED_KEY``: when set, every AMQP queue and exchange declared by any
  process of the app is added (``queue:<name>``, ``exchange:<name>``) to this Redis
  set, so the run can delete what it declared (parking queues among them);
- ``BENCH_RESULT_URL``: result backend; empty: none (with the semaphores in
  PostgreSQL, so that no Redis is in the plugin's path: the harness sees a task end
  by its record);
- ``BENCH_RECORD_URL``: where the task bodies write what they saw;
- ``BENCH_LIMIT``: the cap L of ``ours`` and of ``baseline``;
- ``BENCH_NOOP_LIMIT``: the cap of ``noop_limited`` and ``noop_kept`` (never binds);
- ``BENCH_BACKOFF_BASE`` / ``BENCH_BACKOFF_MAX``: the baseline's retry backoff;
- ``BENCH_PREFETCH_MULTIPLIER``: ``worker_prefetch_multiplier`` (Celery's default, 4);
- ``BENCH_ACKS_LATE``: ``1`` sets ``task_acks_late`` for every task;
- ``BENCH_KEEP_IDLE``: ``semaphore_keep_idle`` of the app (kept permits), when above 0
  (``--keep-idle``): every LimitedTask keeps its permit between tasks while nobody
  waits, but ``noop_limited`` (0: the no-op phase's LimitedTask without) and
  ``noop_kept`` (its own, `NOOP_KEEP_IDLE`).

Tasks:

- ``ours(index, hold)``: a :class:`~celery_semaphore.LimitedTask`, defaults as a
  user gets them (handover mode); the body sleeps ``hold`` seconds;
- ``ours_countdown(index, hold)``: the same in countdown mode, on a semaphore of its own;
- ``plain(index, hold)``: no semaphore, on queue ``bench-plain`` (the backlog's
  reference: workers with L processes in all consume it);
- ``baseline(index, hold)``: a plain task that takes a py-redis-semaphore 0.2
  permit itself (non-blocking), and when refused retries with exponential
  backoff and full jitter, as its README suggests for Celery;
- ``noop_limited(index, total, counter)`` / ``noop_plain(...)``: count themselves in
  Redis; the ``total``-th stamps the time in ``<counter>:last``;
- ``noop_kept(...)``: ``noop_limited`` on a semaphore of its own with kept permits
  (``semaphore_keep_idle`` `NOOP_KEEP_IDLE` s: a pool process keeps its permit between
  tasks while nobody waits, and its next task starts without a store call);
- ``fair(account, index, hold)`` / ``fair_countdown(...)``: ``fair_by`` the account
  (bench_fair.py), handover and countdown mode, each on a semaphore of its own;
  ``unfair(account, index, hold)``: the same without ``fair_by`` (its baseline);
- ``prioritized(index, hold)``: no account, ordered by the message's priority.

Remote control: ``bench_held`` (an inspect command) answers how many messages the
worker holds waiting: ``reserved`` and ``scheduled`` counted as Celery's own
``inspect().reserved()`` and ``.scheduled()`` list them, without the lists.

Each execution of ``ours``/``ours_countdown``/``plain``/``baseline`` (and of the fair and
priority tasks, with their account and their message's priority) appends (when it has ended: off the
hand-off path) one JSON record to the Redis
list ``bench:records:<task>``. In the worker processes, the app also records
(list ``bench:inplace``) every wait in place of ours (``Semaphore.wait_for_turn``,
timed from outside the package) and (list ``bench:waiting``) each
``permit_waiting`` signal (position in line and countdown chosen).
"""

from __future__ import annotations

import functools
import json
import os
import random
import socket
import time
from typing import Any

import redis
from bench_servers import record_amqp_declares
from celery import Celery
from celery.signals import task_postrun, worker_ready
from celery.worker import state as worker_state
from celery.worker.control import inspect_command
from celery.worker.request import Request
from redis_semaphore import Semaphore as PrsSemaphore
from redis_semaphore import SemaphoreConfig as PrsConfig

import celery_semaphore
import celery_semaphore.core._sync.semaphore as semaphore_module
from celery_semaphore import LimitedTask, signals

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6399/0")
RESULT_URL = os.environ.get("BENCH_RESULT_URL", BROKER_URL)
RECORD_URL = os.environ.get("BENCH_RECORD_URL", RESULT_URL)
LIMIT = int(os.environ.get("BENCH_LIMIT", "4"))
NOOP_LIMIT = int(os.environ.get("BENCH_NOOP_LIMIT", "10000"))
BACKOFF_BASE = float(os.environ.get("BENCH_BACKOFF_BASE", "0.1"))
BACKOFF_MAX = float(os.environ.get("BENCH_BACKOFF_MAX", "2"))
PREFETCH_MULTIPLIER = int(os.environ.get("BENCH_PREFETCH_MULTIPLIER", "4"))
ACKS_LATE = os.environ.get("BENCH_ACKS_LATE") == "1"
KEEP_IDLE = float(os.environ.get("BENCH_KEEP_IDLE") or 0)
SEMAPHORE_URL = os.environ.get("BENCH_SEMAPHORE_URL") or None
QUEUE = os.environ.get("BENCH_QUEUE") or "bench"
CONTROL_EXCHANGE = os.environ.get("BENCH_CONTROL_EXCHANGE") or None
DECLARED_KEY = os.environ.get("BENCH_DECLARED_KEY") or None
LEASE = 60.0

OURS = "bench-ours"
OURS_COUNTDOWN = "bench-ours-countdown"
FAIR = "bench-fair"
FAIR_COUNTDOWN = "bench-fair-countdown"
UNFAIR = "bench-unfair"
PRIORITIZED = "bench-prioritized"
BASELINE = "bench-baseline"
NOOP = "bench-noop"
NOOP_KEPT = f"{NOOP}-kept"
#: ``noop_kept``'s ``semaphore_keep_idle``: seconds a pool process keeps an idle permit.
#: Of the order of the idle time between two rounds of ``noop_kept`` (one or two rounds
#: of the other no-op kinds: 1.6 to 6.6 s measured with 2,000 tasks a round on 2 CPUs;
#: bench_celery.py reports it), so its permits are sometimes given back before its next
#: round, which then pays an acquire and a keep per pool process, as a worker that was
#: idle a while would; more often (after the first round) most are still kept.
NOOP_KEEP_IDLE = 5.0
PLAIN_QUEUE = f"{QUEUE}-plain"
READY_KEY = "bench:ready"
FROM_KEY = "bench:ready:from"  # worker name -> where its celery_semaphore was imported from
INPLACE_KEY = "bench:inplace"
WAITING_KEY = "bench:waiting"


def records_key(task: str) -> str:
    return f"bench:records:{task}"


app = Celery("bench_app", broker=BROKER_URL, backend=RESULT_URL)
app.conf.update(
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
    task_acks_late=ACKS_LATE,
)
if SEMAPHORE_URL:
    app.conf.semaphore_redis_url = SEMAPHORE_URL
if CONTROL_EXCHANGE:
    app.conf.control_exchange = CONTROL_EXCHANGE
if KEEP_IDLE > 0:  # unset otherwise: the package's default (off)
    app.conf.semaphore_keep_idle = KEEP_IDLE
_records = redis.Redis.from_url(RECORD_URL)  # redis-py reconnects after the fork
# What this process observed, written after the task ends (task_postrun runs after
# the permit was released): a Redis write between a release and the next start
# would add its round trip to every hand-off measured.
_pending: list[tuple[str, str]] = []


def _record(task: str, **fields: Any) -> None:
    _pending.append((records_key(task), json.dumps(fields)))


@task_postrun.connect
def _flush(**_: Any) -> None:
    if _pending:
        pipe = _records.pipeline(transaction=False)
        for key, value in _pending:
            pipe.rpush(key, value)
        pipe.execute()
        _pending.clear()


def _held(task: Any, kind: str, index: int, hold: float, **extra: Any) -> int:
    start = time.time()
    time.sleep(hold)
    end = time.time()
    header = getattr(task.request, "celery_semaphore", None) or {}
    _record(
        kind,
        id=task.request.id,
        index=index,
        start=start,
        end=end,
        waits=header.get("waits", 0),
        retries=task.request.retries,
        pid=os.getpid(),
        **extra,
    )
    return index


@app.task(bind=True, base=LimitedTask, semaphore=OURS, limit=LIMIT)
def ours(self: Any, index: int, hold: float) -> int:
    """Handover mode (the default)."""
    return _held(self, "ours", index, hold)


@app.task(bind=True, base=LimitedTask, semaphore=OURS_COUNTDOWN, limit=LIMIT,
          semaphore_wait_mode="countdown")  # fmt: skip
def ours_countdown(self: Any, index: int, hold: float) -> int:
    """Countdown mode (a semaphore of its own)."""
    return _held(self, "ours_countdown", index, hold)


@app.task(bind=True, queue=PLAIN_QUEUE)
def plain(self: Any, index: int, hold: float) -> int:
    """No semaphore: run by workers of exactly L processes in all, on a queue of its own
    (the floor a cap of L could reach on this machine: Celery's own hand-offs)."""
    return _held(self, "plain", index, hold)


@app.task(bind=True, max_retries=None)
def baseline(self: Any, index: int, hold: float) -> int:
    permit = PrsSemaphore(_records, PrsConfig(name=BASELINE, limit=LIMIT, lock_timeout=LEASE))
    if not permit.acquire(blocking=False).success:
        cap = min(BACKOFF_MAX, BACKOFF_BASE * 2.0**self.request.retries)
        raise self.retry(countdown=random.uniform(0.0, cap), max_retries=None)
    try:
        start = time.time()
        time.sleep(hold)
        end = time.time()
        _record(
            "baseline",
            id=self.request.id,
            index=index,
            start=start,
            end=end,
            waits=self.request.retries,
            retries=self.request.retries,
            pid=os.getpid(),
        )
    finally:
        permit.release()
    return index


def _account(account: str, *_: Any, **__: Any) -> str:
    return account


@app.task(bind=True, base=LimitedTask, semaphore=FAIR, limit=LIMIT, fair_by=_account)
def fair(self: Any, account: str, index: int, hold: float) -> int:
    """Served in turns between the accounts with tasks waiting (handover mode)."""
    return _held(self, "fair", index, hold, account=account)


@app.task(bind=True, base=LimitedTask, semaphore=FAIR_COUNTDOWN, limit=LIMIT,
          fair_by=_account, semaphore_wait_mode="countdown")  # fmt: skip
def fair_countdown(self: Any, account: str, index: int, hold: float) -> int:
    """The same in countdown mode."""
    return _held(self, "fair_countdown", index, hold, account=account)


@app.task(bind=True, base=LimitedTask, semaphore=UNFAIR, limit=LIMIT)
def unfair(self: Any, account: str, index: int, hold: float) -> int:
    """No ``fair_by``: one line, first come first served (the baseline of ``fair``)."""
    return _held(self, "unfair", index, hold, account=account)


@app.task(bind=True, base=LimitedTask, semaphore=PRIORITIZED, limit=LIMIT)
def prioritized(self: Any, index: int, hold: float) -> int:
    """Ordered by its message's priority (on Redis 0, the default, goes first)."""
    priority = (self.request.delivery_info or {}).get("priority")
    return _held(self, "prioritized", index, hold, priority=priority)


def _count(counter: str, total: int) -> None:
    """Count one more done; the last one stamps the time (no result polling needed)."""
    if _records.incr(counter) == total:
        _records.set(f"{counter}:last", repr(time.time()))


@app.task(base=LimitedTask, semaphore=NOOP, limit=NOOP_LIMIT, ignore_result=True,
          semaphore_keep_idle=0.0)  # fmt: skip
def noop_limited(index: int, total: int, counter: str) -> None:
    _count(counter, total)


@app.task(base=LimitedTask, semaphore=NOOP_KEPT, limit=NOOP_LIMIT, ignore_result=True,
          semaphore_keep_idle=NOOP_KEEP_IDLE)  # fmt: skip
def noop_kept(index: int, total: int, counter: str) -> None:
    _count(counter, total)


@app.task(ignore_result=True)
def noop_plain(index: int, total: int, counter: str) -> None:
    _count(counter, total)


# -- observation from outside the package (worker processes only) ----------------------------


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None) or socket.gethostname()
    _records.hset(FROM_KEY, name, os.path.dirname(celery_semaphore.__file__))
    _records.sadd(READY_KEY, name)


@inspect_command()
def bench_held(state: Any, **_: Any) -> dict[str, int]:
    """Messages this worker holds waiting, counted as ``inspect().reserved()`` and
    ``.scheduled()`` list them (reserved: not scheduled and not active; scheduled: the
    timer's ETA/countdown requests), without building the lists."""
    reserved = state.tset(worker_state.reserved_requests) - state.tset(worker_state.active_requests)
    scheduled = 0
    for waiting in list(state.consumer.timer.schedule.queue):
        args = getattr(waiting.entry, "args", None) or ()
        if args and isinstance(args[0], Request):
            scheduled += 1
    return {"reserved": len(reserved), "scheduled": scheduled}


if DECLARED_KEY:
    record_amqp_declares(_records, DECLARED_KEY)


@signals.permit_waiting.connect
def _on_waiting(sender: Any = None, **fields: Any) -> None:
    if fields.get("semaphore") != OURS:
        return
    _pending.append((
        WAITING_KEY,
        json.dumps(
            {
                "id": fields.get("task_id"),
                "position": fields.get("position"),
                "countdown": fields.get("countdown"),
                "at": time.time(),
            }
        ),
    ))  # fmt: skip


def _timed_wait_for_turn(original: Any) -> Any:
    @functools.wraps(original)
    def wait_for_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        begin = time.time()
        result = original(self, *args, **kwargs)
        if self.name == OURS:
            _pending.append((
                INPLACE_KEY,
                json.dumps(
                    {
                        "id": args[1] if len(args) > 1 else kwargs.get("holder"),
                        "pid": os.getpid(),
                        "start": begin,
                        "end": time.time(),
                        "granted": isinstance(result, semaphore_module.Permit),
                    }
                ),
            ))  # fmt: skip
        return result

    return wait_for_turn


_Semaphore = semaphore_module.Semaphore
if not getattr(_Semaphore.wait_for_turn, "__wrapped__", None):
    _Semaphore.wait_for_turn = _timed_wait_for_turn(_Semaphore.wait_for_turn)  # type: ignore[method-assign]
