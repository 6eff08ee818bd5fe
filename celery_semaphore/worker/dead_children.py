"""Releasing the permits of a pool child that was killed, within a fraction of a second.

The worker's main process hears of a SIGKILLed or OOM-killed child only when
billiard reaps it: at once, or on the pool's maintenance timer up to about 5 s
later. Until then the dead child is a zombie, and Linux can tell its parent so
without reaping it (``waitid`` with ``WNOWAIT``), leaving the reaping, and
Celery's own ``WorkerLostError`` path, untouched. `DeadChildren` looks
every ``interval`` at the children running limited tasks and releases, by task
id, the permits of those killed by a signal; the later ``task_failure`` release
finds nothing left to free (releases are idempotent)::

    child running task T is SIGKILLed          t
    DeadChildren sees it killed (a zombie)     t + <= interval  -> release T by id
    billiard reaps it, WorkerLostError          t + 0.02 .. 4.5 s -> release again: no-op

If billiard reaps the killed child first, the pool still knows: the child's
unfinished job records its exit code (``-9`` for SIGKILL) while billiard waits
``worker_lost_wait`` for a result the child might have sent before it died
(`reaped_by_signal`). That case is released too, on the next look.

A child that exits normally (``worker_max_tasks_per_child``) gave its permits
back in the task's ``finally`` already, and is left alone.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from celery_semaphore.formats import recorded_gates
from celery_semaphore.worker.release import release_by_id

logger = logging.getLogger(__name__)

KILLED = frozenset(
    code for code in (getattr(os, "CLD_KILLED", None), getattr(os, "CLD_DUMPED", None)) if code
)


def killed(pid: int) -> bool:
    """Whether child ``pid`` of this process was killed by a signal and not reaped yet."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already (Celery releases), or not our child
        return False
    return info is not None and info.si_code in KILLED


def reaped_by_signal(pool: Any) -> set[int]:
    """Pids of the prefork pool's children that billiard reaped after a signal
    killed them, while their unfinished jobs wait for ``WorkerLostError``.

    Read from billiard's own state (``Pool._cache`` jobs and their
    ``_worker_lost = (when, exit code)``), defensively: any other pool, or a
    billiard that keeps it otherwise, gives an empty set (the zombie check and
    Celery's own path remain).
    """
    cache = getattr(getattr(pool, "_pool", None), "_cache", None)
    if not isinstance(cache, dict):
        return set()
    pids: set[int] = set()
    try:
        jobs = list(cache.values())
    except RuntimeError:  # changed while we copied it: look again next time
        return set()
    for job in jobs:
        lost = getattr(job, "_worker_lost", None)
        exitcode = lost[1] if isinstance(lost, tuple) and len(lost) == 2 else None
        if isinstance(exitcode, int) and exitcode < 0:  # -N: killed by signal N
            pids.update(pid for pid in job.worker_pids() if isinstance(pid, int))
    return pids


class DeadChildren:
    """A thread that releases the permits of requests whose child was killed.

    ``running()`` lists the worker's requests (``id``, ``task``, ``worker_pid``
    and the recorded gates), as for the heartbeat; ``reaped()``, the pids of
    killed children the pool reaped already (`reaped_by_signal`).
    """

    def __init__(
        self,
        running: Callable[[], Iterable[Any]],
        interval: float = 0.2,
        reaped: Callable[[], set[int]] = set,
        also: Callable[[], None] = lambda: None,
    ) -> None:
        self.running = running
        self.reaped = reaped
        #: Run after each look (the kept permits of children gone: `kept_of_children`).
        self.also = also
        self.interval = interval
        self._released: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="celery-semaphore-dead-children", daemon=True
        )

    def start(self) -> None:
        if hasattr(os, "waitid") and KILLED:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.look()
                self.also()
            except Exception:  # never take the worker down; Celery's own path remains
                logger.exception("celery-semaphore: looking for killed children failed")

    def handled(self, request: Any) -> bool:
        """Whether this thread released ``request``'s permits because its child was
        killed (the pool may have reaped that child already, while the request is
        still listed until Celery processes its ``WorkerLostError``)."""
        return (request.id, getattr(request, "worker_pid", None)) in self._released

    def look(self) -> None:
        """One look at every running limited request's child."""
        seen = set()
        reaped: set[int] | None = None
        for request in self.running():
            pid = getattr(request, "worker_pid", None)
            gates = recorded_gates(request)
            if not pid or not gates:
                continue
            key = (request.id, pid)
            seen.add(key)
            if key in self._released:
                continue
            if not killed(pid):
                if reaped is None:
                    reaped = self.reaped()
                if pid not in reaped:
                    continue
            self._released.add(key)
            logger.warning(
                "celery-semaphore: the process running %s[%s] (pid %s) was killed: "
                "releasing its permits",
                request.task.name,
                request.id,
                pid,
            )
            release_by_id(request.task, request.id, gates)
        self._released &= seen
