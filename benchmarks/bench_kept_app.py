"""The Celery app of ``bench_kept.py``, run by one real prefork ``celery worker``.

Configured from the environment (``bench_kept.py`` sets these before it imports this
module and before it starts the worker):

- ``BENCH_KEPT_BROKER_URL``: broker (the script's redis-server, db 0);
- ``BENCH_KEPT_RESULT_URL``: result backend (db 1);
- ``BENCH_KEPT_RECORD_URL``: where the worker processes write what they saw (db 2);
- ``BENCH_KEPT_SEMAPHORE_URL``: ``semaphore_url`` (the broker's Redis, or a
  ``postgresql://`` URL with ``--store postgres``);
- ``BENCH_KEPT_KEEP_IDLE``: ``semaphore_keep_idle`` of the app (0: off).

Tasks (each a `LimitedTask` on a semaphore of its own; the body sleeps ``hold`` s,
records its start and end, and returns its pool process's pid):

- ``idle(hold)``: limit `LIMIT` (2), as many as the worker's pool processes: once
  both keep a permit, the semaphore is full of idle kept permits;
- ``busy(hold)``: limit `BUSY_LIMIT` (20): with both processes' kept permits held,
  a publisher still finds room to spare (celery_semaphore.room_at_publish: 8 free
  permits at least, a limit of 8 at least), so the tasks it publishes go without a
  place and start on the kept permits; the script takes the other permits before it
  forms a line. (A place taken at publish where nobody waits is the first waiter of
  an empty line: it recalls the kept permits, and its task holds a place, so it takes
  the ordinary path. Every task of a semaphore of limit under 8 takes one.)
- ``line(hold)``: limit `LIMIT` (2); the script holds one permit and waits for the
  other while the task runs: the task ends with a line behind it.

Observation, in the worker processes, timed from outside the package (list
`EVENTS_KEY`, written by a thread of each process, off the paths measured): every
body's ``start`` and ``end``; ``recall`` (the keeper heard its wake channel, or its
renewal interval came: ``Keeper.recall``; after ``Keeper.renew``, a renewal
interval came: the ``recall`` that follows says ``cause`` ``renewal``, not ``message``,
and how many permits it ``gave`` back); ``give_back`` (``Permit.release`` of a kept
holder: ``begin`` and ``end`` of the call); ``keep`` (``Keeper.keep``: a task ended
and asks the store to keep its permit; ``listen_s``: how long of it went waiting for
the keeper thread to listen to the semaphore's wake channel, ``Keeper._listen_to``;
``store_s`` and ``outcome``: the store's call, ``Permit.keep``, and what it answered:
``kept``, ``released`` (a line, or another reason not to keep) or ``lost``).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready

from celery_semaphore import LimitedTask, kept_permits
from celery_semaphore.core import Permit
from celery_semaphore.core.constants import KEPT_PREFIX

BROKER_URL = os.environ.get("BENCH_KEPT_BROKER_URL", "redis://127.0.0.1:6399/0")
RESULT_URL = os.environ.get("BENCH_KEPT_RESULT_URL", BROKER_URL)
RECORD_URL = os.environ.get("BENCH_KEPT_RECORD_URL", RESULT_URL)
SEMAPHORE_URL = os.environ.get("BENCH_KEPT_SEMAPHORE_URL") or BROKER_URL
KEEP_IDLE = float(os.environ.get("BENCH_KEPT_KEEP_IDLE") or 0)
#: The worker's pool processes (bench_kept.py starts it with ``-c CONCURRENCY``).
CONCURRENCY = 2
LIMIT = CONCURRENCY
BUSY_LIMIT = 20

IDLE = "bench-kept-idle"
BUSY = "bench-kept-busy"
LINE = "bench-kept-line"
READY_KEY = "bench-kept:ready"
EVENTS_KEY = "bench-kept:events"

app = Celery("bench_kept_app", broker=BROKER_URL, backend=RESULT_URL)
app.conf.update(
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
    task_default_queue="bench-kept",
    semaphore_url=SEMAPHORE_URL,
)
if KEEP_IDLE > 0:
    app.conf.semaphore_keep_idle = KEEP_IDLE


# -- records: a writer thread per process (a fork gets its own) -----------------------------


class _Writer:
    def __init__(self) -> None:
        self.pid = 0
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue[str] = queue.SimpleQueue()

    def emit(self, **fields: Any) -> None:
        if self.pid != os.getpid():
            with self.lock:
                if self.pid != os.getpid():
                    self.queue = queue.SimpleQueue()
                    threading.Thread(
                        target=self._write, args=(self.queue,), name="bench-kept-writer",
                        daemon=True,
                    ).start()  # fmt: skip
                    self.pid = os.getpid()
        self.queue.put(json.dumps({**fields, "pid": os.getpid()}))

    @staticmethod
    def _write(items: queue.SimpleQueue[str]) -> None:
        client = redis.Redis.from_url(RECORD_URL)
        while True:
            batch = [items.get()]
            while not items.empty():
                batch.append(items.get())
            client.rpush(EVENTS_KEY, *batch)


_writer = _Writer()
os.register_at_fork(after_in_child=lambda: setattr(_writer, "lock", threading.Lock()))
emit = _writer.emit


def _held(kind: str, hold: float) -> int:
    start = time.time()
    emit(event="start", kind=kind, at=start)
    time.sleep(hold)
    emit(event="end", kind=kind, start=start, at=time.time())
    return os.getpid()


@app.task(base=LimitedTask, semaphore=IDLE, limit=LIMIT)
def idle(hold: float) -> int:
    return _held("idle", hold)


@app.task(base=LimitedTask, semaphore=BUSY, limit=BUSY_LIMIT)
def busy(hold: float) -> int:
    return _held("busy", hold)


@app.task(base=LimitedTask, semaphore=LINE, limit=LIMIT)
def line(hold: float) -> int:
    return _held("line", hold)


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    with redis.Redis.from_url(RECORD_URL) as client:
        client.sadd(READY_KEY, getattr(sender, "hostname", None) or "worker")


# -- observation from outside the package -----------------------------------------------------

_Keeper = kept_permits.Keeper
_recall, _renew, _keep = _Keeper.recall, _Keeper.renew, _Keeper.keep
_listen_to = getattr(_Keeper, "_listen_to", None)
_release, _permit_keep = Permit.release, Permit.keep
_listening = threading.local()


def _timed_recall(self: Any) -> None:
    cause = "renewal" if getattr(_listening, "renewing", False) else "message"
    _listening.renewing, _listening.gave = False, 0
    at = time.time()
    _recall(self)
    emit(event="recall", at=at, done=time.time(), cause=cause, gave=_listening.gave)


def _timed_renew(self: Any) -> None:
    _listening.renewing = True  # the keeper thread's next recall is the renewal's
    _renew(self)


def _timed_keep(self: Any, gate: Any, *args: Any, **kwargs: Any) -> Any:
    _listening.seconds = _listening.store_s = 0.0
    _listening.outcome = None
    begin = time.time()
    result = _keep(self, gate, *args, **kwargs)
    emit(event="keep", semaphore=gate.name, begin=begin, end=time.time(), returned=result,
         listen_s=_listening.seconds, store_s=_listening.store_s,
         outcome=_listening.outcome)  # fmt: skip
    return result


def _timed_permit_keep(self: Any, *args: Any, **kwargs: Any) -> Any:
    begin = time.monotonic()
    result = _permit_keep(self, *args, **kwargs)
    _listening.store_s = time.monotonic() - begin
    _listening.outcome = "kept" if isinstance(result, Permit) else "released" if result else "lost"
    return result


def _timed_listen_to(self: Any, semaphore: Any) -> None:
    begin = time.monotonic()
    assert _listen_to is not None
    _listen_to(self, semaphore)
    _listening.seconds = getattr(_listening, "seconds", 0.0) + time.monotonic() - begin


def _timed_release(self: Any) -> bool:
    if not self.holder.startswith(KEPT_PREFIX):
        return _release(self)
    _listening.gave = getattr(_listening, "gave", 0) + 1
    begin = time.time()
    released = _release(self)
    emit(event="give_back", semaphore=self.semaphore.name, holder=self.holder, begin=begin,
         end=time.time(), released=released)  # fmt: skip
    return released


if not getattr(_Keeper.recall, "__bench_kept__", False):
    for owner, name, timed in (
        (_Keeper, "recall", _timed_recall),
        (_Keeper, "renew", _timed_renew),
        (_Keeper, "keep", _timed_keep),
        (_Keeper, "_listen_to", _timed_listen_to if _listen_to is not None else None),
        (Permit, "release", _timed_release),
        (Permit, "keep", _timed_permit_keep),
    ):
        if timed is not None:
            timed.__bench_kept__ = True  # type: ignore[attr-defined]
            setattr(owner, name, timed)
