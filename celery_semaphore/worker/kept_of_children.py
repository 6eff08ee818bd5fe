"""The worker's main process gives back the permits its pool children kept, when a
child dies or the worker is shut down cold (`celery_semaphore.kept_permits`).

A child that exits normally (warm shutdown, ``worker_max_tasks_per_child``) gives its
kept permits back itself (``worker_process_shutdown``). One that is killed cannot: the
main process knows each child's pid, and the names its kept permits may have
(``kept|<worker>|<pid>|<weight>|<semaphore>``: the gates its tasks could keep, noted as
their messages arrive), and releases those by id; a name kept by nobody releases
nothing. What it misses (a gate it never noted) ends with its lease::

    child P keeps a permit of gate G                 t
    child P is SIGKILLed                             t1
    DeadChildren's next look finds P gone or killed  t1 + <= 0.2 s -> release kept|W|P|..|G
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery_semaphore.config import get_config
from celery_semaphore.core.errors import SemaphoreError
from celery_semaphore.formats import Gate
from celery_semaphore.gates import semaphore_of
from celery_semaphore.kept_permits import kept_holder
from celery_semaphore.state import state_of
from celery_semaphore.worker.dead_children import killed

logger = logging.getLogger(__name__)

#: The gates noted per worker, the oldest dropped past it (a key function's gates).
MOST_GATES = 256


def note_gate(app: Any, gate: Gate) -> None:
    """A request that may keep a permit of ``gate`` arrived (main process)."""
    gates = state_of(app).kept_gates
    gates[(gate.name, gate.limit, gate.weight)] = gate
    if len(gates) > MOST_GATES:
        del gates[next(iter(gates))]


def pool_pids(pool: Any) -> set[int]:
    """The pids of a prefork pool's children (billiard's ``Pool._pool``), read
    defensively: any other pool has none."""
    processes = getattr(getattr(pool, "_pool", None), "_pool", None)
    if not isinstance(processes, list):
        return set()
    return {p.pid for p in list(processes) if isinstance(getattr(p, "pid", None), int)}


class KeptOfChildren:
    """The children a worker has seen, and the release of their kept permits."""

    def __init__(self, app: Any, hostname: str | None, pool: Any) -> None:
        self.app = app
        self.hostname = hostname
        self.pool = pool
        self._known: set[int] = set()
        self._lock = threading.Lock()

    def look(self) -> None:
        """Release the kept permits of every child gone or killed since the last look."""
        if not state_of(self.app).keeps_permits:
            return
        now = pool_pids(self.pool)
        with self._lock:
            gone = {pid for pid in self._known if pid not in now or killed(pid)}
            self._known = (self._known | now) - gone
        for pid in gone:
            self.release(pid)

    def release_all(self) -> None:
        """Cold shutdown: the children are terminated; their kept permits go now."""
        self.look()
        with self._lock:
            known, self._known = self._known | pool_pids(self.pool), set()
        for pid in known:
            self.release(pid)

    def release(self, pid: int) -> None:
        config = get_config(self.app)
        for gate in list(state_of(self.app).kept_gates.values()):
            holder = kept_holder(self.hostname, pid, gate)
            try:
                if semaphore_of(self.app, gate, config).release(holder):
                    logger.info("celery-semaphore: gave back %s (its process ended)", holder)
            except SemaphoreError as error:
                logger.warning("could not give back %s (its lease runs out): %s", holder, error)
