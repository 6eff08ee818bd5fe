"""How many of a worker's pool processes (threads, greenlets) run a task now, kept where
every one of them reads it: whether a task may wait in place long depends on it.

A wait in place blocks a pool process for up to ``semaphore_max_block``
(`celery_semaphore.waiting`). While another process of the worker is idle that costs
nothing (the worker still starts tasks) and it makes the hand-over fast. When every
other process runs a task, the worker starts no other task while it waits, and other
work (other queues, other semaphores, plain tasks) waits for a process. Then a task that
would park waits in place only for a turn due within ``NEAR_TURN`` (0.1 s, a few
hand-overs through the broker), and parks otherwise. Decided when the wait begins: a
longer wait begun while a process was idle goes on if that process takes a task.

One byte per process at the pool's index of the process (billiard gives a new process
the lowest free index), in anonymous shared memory the worker's main process maps before
the pool forks: absent (no process there: autoscale below its maximum, or a process that
exited), idle, or busy. Each process marks itself idle when it starts
(``worker_process_init``), busy at ``task_prerun``, idle at ``task_postrun`` and absent
at ``worker_process_shutdown``. A process killed in a task stays busy until its
replacement starts. No locks: a reading may be one task behind, which only makes one
wait shorter or longer. Pool processes that are not forked
(``worker_pool_start_method = "spawn"``) do not see the table: waits in place there
follow ``semaphore_max_block`` alone.

The pools that run tasks in the worker's own process (threads, gevent, eventlet, solo)
keep a count of the tasks running against the pool's size instead
(`InProcessOccupancy`).
"""

from __future__ import annotations

import mmap
import threading
from typing import Any

from billiard.process import current_process
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool

from celery_semaphore.config import NEAR_TURN

ABSENT, IDLE, BUSY = 0, 1, 2


class PoolOccupancy:
    """A byte per pool process: absent, idle, or busy while it runs a task (a task it
    runs inside another, with ``apply()``, ends without making it idle)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._bytes = mmap.mmap(-1, processes)
        #: Tasks running now, one inside the other, by pool index; a pool process
        #: (which has its own copy after the fork) only ever counts at its own index.
        self._depth: dict[int, int] = {}

    def process_started(self) -> None:
        self._count(0)

    def started(self) -> None:
        self._count(+1)

    def ended(self) -> None:
        self._count(-1)

    def process_ended(self) -> None:
        index = _own_index()
        if index is not None and index < self.processes:
            self._depth.pop(index, None)
            self._bytes[index] = ABSENT

    def _count(self, change: int) -> None:
        index = _own_index()
        if index is None or index >= self.processes:
            return
        depth = 0 if change == 0 else max(0, self._depth.get(index, 0) + change)
        self._depth[index] = depth
        self._bytes[index] = BUSY if depth else IDLE

    def another_idle(self) -> bool:
        """Whether a process of the pool other than this one is up and runs no task."""
        idle = self._bytes[:].count(IDLE)
        index = _own_index()
        if index is not None and index < self.processes and self._bytes[index] == IDLE:
            idle -= 1
        return idle > 0


class InProcessOccupancy:
    """The tasks running in a pool that runs them in the worker's own process (threads,
    gevent, eventlet, solo): a count against the pool's size (a task run inside
    another, with ``apply()``, counts once)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._running = 0
        self._lock = threading.Lock()
        self._depth = threading.local()  # per greenlet under gevent and eventlet

    def process_started(self) -> None:
        pass

    def process_ended(self) -> None:
        pass

    def started(self) -> None:
        depth = getattr(self._depth, "tasks", 0)
        self._depth.tasks = depth + 1
        if depth == 0:
            with self._lock:
                self._running += 1

    def ended(self) -> None:
        depth = getattr(self._depth, "tasks", 0)
        if depth == 0:
            return
        self._depth.tasks = depth - 1
        if depth == 1:
            with self._lock:
                self._running -= 1

    def another_idle(self) -> bool:
        """Whether the pool has room for a task besides those running (the asking
        task among them)."""
        return self._running < self.size


def _own_index() -> int | None:
    index = getattr(current_process(), "index", None)
    return index if isinstance(index, int) else None


#: This worker's occupancy (a process runs one worker); None outside a worker.
current: PoolOccupancy | InProcessOccupancy | None = None


def start_for(worker: Any) -> None:
    """In the worker's main process, before the pool forks: a prefork worker's table,
    one byte for each process its pool may have (its autoscale maximum); a count for
    the pools that run tasks in the worker's own process (the solo pool runs one at a
    time, whatever the concurrency says)."""
    global current  # noqa: PLW0603 - one table per worker process
    pool = worker.pool_cls
    size = getattr(worker, "max_concurrency", None) or worker.concurrency or 1
    if not isinstance(pool, type):
        current = None
    elif issubclass(pool, PreforkPool):
        current = PoolOccupancy(size)
    else:
        current = InProcessOccupancy(1 if issubclass(pool, SoloPool) else size)


def max_block(configured: float) -> float:
    """How long a task that would otherwise park may wait in place now: ``configured``,
    or at most `NEAR_TURN` while every other process of its worker's pool runs a task."""
    table = current
    if table is None or configured <= NEAR_TURN or table.another_idle():
        return configured
    return NEAR_TURN


def on_task_start(**_: Any) -> None:
    table = current
    if table is not None:
        table.started()


def on_task_end(**_: Any) -> None:
    table = current
    if table is not None:
        table.ended()


def on_process_start(**_: Any) -> None:
    table = current
    if table is not None:
        table.process_started()


def on_process_end(**_: Any) -> None:
    table = current
    if table is not None:
        table.process_ended()
