"""Which of a prefork worker's pool processes run a task now, kept where every process of
the pool reads it: whether a task may wait in place long depends on it.

A wait in place blocks a pool process for up to ``semaphore_max_block``
(`celery_semaphore.waiting`). While another process of the worker is idle that costs
nothing (the worker still takes messages) and it makes the hand-over fast. When every
other process runs a task, the worker takes no message while it waits, and other work
(other queues, other semaphores, plain tasks) waits for a process. Then a task waits in
place only for a turn due within ``NEAR_TURN`` (0.1 s), a few hand-overs through the
broker; otherwise it parks.

One byte per process at the pool's index of the process (billiard gives a new process
the index of the one it replaces), in anonymous shared memory the worker's main process
maps before the pool forks. Each process sets its own byte at ``task_prerun``, clears it
at ``task_postrun`` and when it starts (a process killed in a task leaves its byte set
until its replacement starts). No locks: a reading may be one task behind, which only
makes one wait shorter or longer. Other pools (threads, solo, gevent, eventlet) keep no
table, and waits in place there follow ``semaphore_max_block`` alone.
"""

from __future__ import annotations

import mmap
from typing import Any

from billiard.process import current_process

from celery_semaphore.config import NEAR_TURN


class PoolOccupancy:
    """A byte per pool process: 1 while it runs a task (a task it runs inside another,
    with ``apply()``, ends without clearing it)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._bytes = mmap.mmap(-1, processes)
        #: Tasks running now, one inside the other, by pool index; a pool process
        #: (which has its own copy after the fork) only ever counts at its own index.
        self._depth: dict[int, int] = {}

    def started(self) -> None:
        self._count(+1)

    def ended(self) -> None:
        self._count(-1)

    def process_started(self) -> None:
        self._count(None)

    def _count(self, change: int | None) -> None:
        index = _own_index()
        if index is None or index >= self.processes:
            return
        depth = 0 if change is None else max(0, self._depth.get(index, 0) + change)
        self._depth[index] = depth
        self._bytes[index] = 1 if depth else 0

    def another_idle(self) -> bool:
        """Whether a process of the pool other than this one runs no task now."""
        idle = self._bytes[:].count(0)
        index = _own_index()
        if index is not None and index < self.processes and self._bytes[index] == 0:
            idle -= 1
        return idle > 0


def _own_index() -> int | None:
    index = getattr(current_process(), "index", None)
    return index if isinstance(index, int) else None


#: This worker's table (a process runs one worker); None outside a prefork worker.
current: PoolOccupancy | None = None


def start(processes: int) -> None:
    """Make the table, in the worker's main process before the pool forks."""
    global current  # noqa: PLW0603 - one table per worker process
    current = PoolOccupancy(processes)


def max_block(configured: float) -> float:
    """How long a task may wait in place now: ``configured``, or at most
    `NEAR_TURN` while every other process of its prefork worker runs a task."""
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
