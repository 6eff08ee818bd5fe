"""The Celery app of ``bench_rate.py``, run by real ``celery worker`` processes.

Configured from the environment (``bench_rate.py`` sets these before it imports
this module and before it starts the workers):

- ``BENCH_BROKER_URL``: broker, and the semaphores' Redis (the default
  ``semaphore_redis_url`` is the broker's URL);
- ``BENCH_SEMAPHORE_URL``: ``semaphore_redis_url`` (``semaphore_url``'s older name,
  read the same way), when set (not empty): a Redis of its own beside a RabbitMQ or a
  Redis broker (``bench_rate.py --broker``), or a ``postgresql://`` URL
  (``--semaphore-store postgres``: then ours touch no Redis; the baselines' buckets and
  semaphores stay in ``BENCH_RECORD_URL``'s);
- ``BENCH_QUEUE_PREFIX``: put before every queue name (empty by default; unique to
  the run on a shared broker);
- ``BENCH_CONTROL_EXCHANGE``: ``control_exchange``, when set (unique to the run on a
  shared broker);
- ``BENCH_DECLARED_KEY``: when set, every AMQP queue and exchange declared by any
  process of the app is added to this Redis set (``bench_servers.record_amqp_declares``),
  so the run can delete what it declared;
- ``BENCH_RECORD_URL``: where the task bodies write what they saw, and the
  baselines' token buckets and semaphores;
- ``BENCH_WORKERS``: how many workers run this app (Celery's ``rate_limit`` is per
  worker: the "split" baselines divide the cluster's rate by it);
- ``BENCH_RATE``: the accuracy scenario's cluster-wide rate, starts per second;
- ``BENCH_BOTH_LIMIT`` / ``BENCH_BOTH_RATE``: the cap and rate of the scenario with both;
- ``BENCH_PAUSE_RATE`` / ``BENCH_PAUSE_S``: the rate of the pause scenario, and
  the pause one task asks for once;
- ``BENCH_BUCKET_JITTER``: the token-bucket recipe's jitter, seconds (uniform from 0).

Tasks, by scenario (every one ``ignore_result``, on a queue named after it,
``queue_of(name)``; the harness waits for the records):

- accuracy, ``(index, hold)``: ``rate_ours`` (``LimitedTask`` with ``rate=``,
  handover mode), ``rate_ours_countdown`` (countdown mode, a semaphore of its own),
  ``rate_celery`` (Celery's ``rate_limit`` set to the cluster's rate, as if it were
  cluster-wide), ``rate_celery_split`` (``rate_limit`` = rate / workers), ``rate_bucket``
  (a Redis token bucket checked in the body, ``self.retry`` when refused);
- both, ``(index, hold)``: ``both_ours`` (``limit=`` and ``rate=``), ``both_baseline``
  (Celery's ``rate_limit`` = rate / workers, and a py-redis-semaphore permit in the body,
  refused -> ``self.retry`` with exponential backoff and full jitter);
- pause, ``(index, hold, raise_index, tag)``: the task whose index is ``raise_index``
  asks for a pause once (a Redis flag named by ``tag``): ``pause_ours`` raises
  ``RateLimited(retry_after=...)``; ``pause_celery`` (``rate_limit`` = rate / workers)
  can only ``self.retry(countdown=...)`` itself; ``pause_bucket`` pauses its token
  bucket for everyone and retries itself with the same countdown.

The ``*_ours`` tasks exist only when the package has rate limits (``HAVE_RATES``).
Their waits in place (worker processes blocked in ``Semaphore.wait_for_turn``, timed
from outside the package) go to the list ``bench-rate:inplace:<semaphore>``.

Each body run appends, once its task has ended (off the path between a start and the
next), one JSON record to the Redis list ``bench-rate:records:<task>``: index, start,
end (``time.time()``), ``request.retries``, the waits (the plugin's count for ours, the
retries for a baseline), task id, pid, worker. A pause
asked for is recorded in ``bench-rate:raises:<task>`` with the time of the raise.
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
from redis_semaphore import Semaphore as PrsSemaphore
from redis_semaphore import SemaphoreConfig as PrsConfig

import celery_semaphore.core._sync.semaphore as semaphore_module
from celery_semaphore import LimitedTask

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6399/0")
RECORD_URL = os.environ.get("BENCH_RECORD_URL", BROKER_URL)
SEMAPHORE_URL = os.environ.get("BENCH_SEMAPHORE_URL") or None
QUEUE_PREFIX = os.environ.get("BENCH_QUEUE_PREFIX", "")
CONTROL_EXCHANGE = os.environ.get("BENCH_CONTROL_EXCHANGE") or None
DECLARED_KEY = os.environ.get("BENCH_DECLARED_KEY") or None
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
RATE = float(os.environ.get("BENCH_RATE", "20"))
BOTH_LIMIT = int(os.environ.get("BENCH_BOTH_LIMIT", "3"))
BOTH_RATE = float(os.environ.get("BENCH_BOTH_RATE", "10"))
PAUSE_RATE = float(os.environ.get("BENCH_PAUSE_RATE", "10"))
PAUSE_S = float(os.environ.get("BENCH_PAUSE_S", "2"))
BUCKET_JITTER = float(os.environ.get("BENCH_BUCKET_JITTER", "1"))
BACKOFF_BASE, BACKOFF_MAX = 0.1, 2.0  # bench_celery.py's py-redis-semaphore baseline
LEASE = 60.0

try:
    from celery_semaphore import RateLimited
except ImportError:
    HAVE_RATES = False
else:
    HAVE_RATES = True

READY_KEY = "bench-rate:ready"
BOTH_BASELINE_SEMAPHORE = "bench-both-baseline"
SEMAPHORES = {  # ours: the semaphore of each task
    "rate_ours": "bench-rate",
    "rate_ours_countdown": "bench-rate-countdown",
    "both_ours": "bench-both",
    "pause_ours": "bench-pause",
}


def per_s(rate: float) -> str:
    return f"{rate:g}/s"


def queue_of(task: str) -> str:
    """The queue of a task (its short name)."""
    return QUEUE_PREFIX + task


def records_key(task: str) -> str:
    return f"bench-rate:records:{task}"


def raises_key(task: str) -> str:
    return f"bench-rate:raises:{task}"


def in_place_key(semaphore: str) -> str:
    return f"bench-rate:inplace:{semaphore}"


app = Celery("bench_rate_app", broker=BROKER_URL)
app.conf.update(
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    # Each task on a queue of its own, named after it: the harness starts the workers of
    # one variant at a time (-Q), so a variant's leftovers never reach the next one.
    task_routes=(lambda name, *_, **__: {"queue": queue_of(name.rsplit(".", 1)[-1])},),
)
if SEMAPHORE_URL:
    app.conf.semaphore_redis_url = SEMAPHORE_URL
if CONTROL_EXCHANGE:
    app.conf.control_exchange = CONTROL_EXCHANGE
_records = redis.Redis.from_url(RECORD_URL)  # redis-py reconnects after the fork
if DECLARED_KEY:
    record_amqp_declares(_records, DECLARED_KEY)
_pending: list[tuple[str, str]] = []


@task_postrun.connect
def _flush(**_: Any) -> None:
    if _pending:
        pipe = _records.pipeline(transaction=False)
        for key, value in _pending:
            pipe.rpush(key, value)
        pipe.execute()
        _pending.clear()


def _body(task: Any, kind: str, index: int, hold: float) -> None:
    start = time.time()
    time.sleep(hold)
    end = time.time()
    request = task.request
    waits = getattr(request, "celery_semaphore_waits", None)  # set in a LimitedTask's body
    record = {
        "id": request.id,
        "index": index,
        "start": start,
        "end": end,
        "retries": request.retries,
        "waits": request.retries if waits is None else waits,  # a baseline waits by retrying
        "pid": os.getpid(),
        "worker": request.hostname,
    }
    _pending.append((records_key(kind), json.dumps(record)))


def _asks_pause(kind: str, index: int, raise_index: int, tag: str) -> bool:
    """True once per run (``tag``): for the task whose index is ``raise_index``, on its
    first run. The raise is recorded with its time (taken after the flag's round trip)."""
    if index != raise_index or not _records.set(f"bench-rate:raised:{tag}", 1, nx=True):
        return False
    _pending.append((raises_key(kind), json.dumps({"index": index, "at": time.time()})))
    return True


# -------------------------------------------------------------------- the token bucket

# KEYS[1]: the bucket (hash: tokens, at); KEYS[2]: when a pause ends (ms, Redis clock).
# ARGV[1]: tokens per second; ARGV[2]: capacity; ARGV[3]: pause to start now, ms (0: none).
# Returns 0 when a token was taken, else milliseconds until the next one may be.
BUCKET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local pause = tonumber(ARGV[3])
if pause > 0 then
  redis.call('SET', KEYS[2], now + pause, 'PX', math.ceil(pause))
  return math.ceil(pause)
end
local paused_until = tonumber(redis.call('GET', KEYS[2]) or '0')
if paused_until > now then
  return math.ceil(paused_until - now)
end
local per_ms = tonumber(ARGV[1]) / 1000
local capacity = tonumber(ARGV[2])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or capacity)
local at = tonumber(redis.call('HGET', KEYS[1], 'at') or now)
tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
if tokens >= 1 then
  redis.call('HSET', KEYS[1], 'tokens', tokens - 1, 'at', now)
  return 0
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
return math.ceil((1 - tokens) / per_ms)
"""
_bucket = _records.register_script(BUCKET_LUA)


def _bucket_wait(name: str, rate: float, pause_s: float = 0.0) -> float:
    """Seconds until the next token of bucket ``name`` (0.0: a token was taken)."""
    keys = [f"bench-rate:bucket:{name}", f"bench-rate:bucket:{name}:paused"]
    return int(_bucket(keys=keys, args=[rate, 1, int(pause_s * 1000)])) / 1000


def _bucket_retry(task: Any, wait: float) -> Exception:
    countdown = wait + random.uniform(0.0, BUCKET_JITTER)
    return task.retry(countdown=countdown, max_retries=None)  # type: ignore[no-any-return]


# -------------------------------------------------------------------- accuracy


@app.task(bind=True, rate_limit=per_s(RATE))
def rate_celery(self: Any, index: int, hold: float) -> None:
    _body(self, "rate_celery", index, hold)


@app.task(bind=True, rate_limit=per_s(RATE / WORKERS))
def rate_celery_split(self: Any, index: int, hold: float) -> None:
    _body(self, "rate_celery_split", index, hold)


@app.task(bind=True, max_retries=None)
def rate_bucket(self: Any, index: int, hold: float) -> None:
    wait = _bucket_wait("rate", RATE)
    if wait > 0:
        raise _bucket_retry(self, wait)
    _body(self, "rate_bucket", index, hold)


# -------------------------------------------------------------------- both


@app.task(bind=True, max_retries=None, rate_limit=per_s(BOTH_RATE / WORKERS))
def both_baseline(self: Any, index: int, hold: float) -> None:
    config = PrsConfig(name=BOTH_BASELINE_SEMAPHORE, limit=BOTH_LIMIT, lock_timeout=LEASE)
    permit = PrsSemaphore(_records, config)
    if not permit.acquire(blocking=False).success:
        cap = min(BACKOFF_MAX, BACKOFF_BASE * 2.0**self.request.retries)
        raise self.retry(countdown=random.uniform(0.0, cap), max_retries=None)
    try:
        _body(self, "both_baseline", index, hold)
    finally:
        permit.release()


# -------------------------------------------------------------------- pause


@app.task(bind=True, rate_limit=per_s(PAUSE_RATE / WORKERS), max_retries=None)
def pause_celery(self: Any, index: int, hold: float, raise_index: int, tag: str) -> None:
    if _asks_pause("pause_celery", index, raise_index, tag):
        raise self.retry(countdown=PAUSE_S, max_retries=None)
    _body(self, "pause_celery", index, hold)


@app.task(bind=True, max_retries=None)
def pause_bucket(self: Any, index: int, hold: float, raise_index: int, tag: str) -> None:
    wait = _bucket_wait("pause", PAUSE_RATE)
    if wait > 0:
        raise _bucket_retry(self, wait)
    if _asks_pause("pause_bucket", index, raise_index, tag):
        _bucket_wait("pause", PAUSE_RATE, pause_s=PAUSE_S)
        raise self.retry(countdown=PAUSE_S, max_retries=None)
    _body(self, "pause_bucket", index, hold)


# -------------------------------------------------------------------- ours

if HAVE_RATES:

    @app.task(bind=True, base=LimitedTask, semaphore="bench-rate", rate=per_s(RATE))
    def rate_ours(self: Any, index: int, hold: float) -> None:
        _body(self, "rate_ours", index, hold)

    @app.task(bind=True, base=LimitedTask, semaphore="bench-rate-countdown", rate=per_s(RATE),
              semaphore_wait_mode="countdown")  # fmt: skip
    def rate_ours_countdown(self: Any, index: int, hold: float) -> None:
        _body(self, "rate_ours_countdown", index, hold)

    @app.task(bind=True, base=LimitedTask, semaphore="bench-both", limit=BOTH_LIMIT,
              rate=per_s(BOTH_RATE))  # fmt: skip
    def both_ours(self: Any, index: int, hold: float) -> None:
        _body(self, "both_ours", index, hold)

    @app.task(bind=True, base=LimitedTask, semaphore="bench-pause", rate=per_s(PAUSE_RATE))
    def pause_ours(self: Any, index: int, hold: float, raise_index: int, tag: str) -> None:
        if _asks_pause("pause_ours", index, raise_index, tag):
            raise RateLimited(retry_after=PAUSE_S)
        _body(self, "pause_ours", index, hold)


@app.task
def warm(index: int) -> None:
    _pending.append((records_key("warm"), json.dumps({"index": index, "pid": os.getpid()})))


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    _records.sadd(READY_KEY, getattr(sender, "hostname", None) or socket.gethostname())


# -- waits in place of ours, timed from outside the package (worker processes only) ----------


def _timed_wait_for_turn(original: Any) -> Any:
    @functools.wraps(original)
    def wait_for_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        begin = time.time()
        result = original(self, *args, **kwargs)
        if self.name in SEMAPHORES.values():
            wait = {
                "holder": args[1] if len(args) > 1 else kwargs.get("holder"),
                "pid": os.getpid(),
                "start": begin,
                "end": time.time(),
                "granted": isinstance(result, semaphore_module.Permit),
            }
            _pending.append((in_place_key(self.name), json.dumps(wait)))
        return result

    return wait_for_turn


_Semaphore = semaphore_module.Semaphore
if not getattr(_Semaphore.wait_for_turn, "__wrapped__", None):
    _Semaphore.wait_for_turn = _timed_wait_for_turn(_Semaphore.wait_for_turn)  # type: ignore[method-assign]
