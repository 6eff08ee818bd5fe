"""The lease heartbeat: renews the permits of every running limited task of a worker.

A plain service that knows nothing of bootsteps or of the worker's state: it
is given the app and functions that list the running requests and the revoked
task ids, so the worker bootstep (``bootstep.py``) or a test can drive it. One
thread, one ``renew_many`` call per semaphore per interval.

In handover mode it also looks after parked tasks, once per interval, in every
semaphore that has some: it publishes those whose turn came while nobody called
(a lease ran out), publishes again those whose publisher died before publishing
(past ``semaphore_handover_deadline``), and drops revoked ones from the line.
When Redis restarts without the parked tasks it had (no persistence, with
``semaphore_park_without_persistence``), it says so in an ERROR: those tasks
are lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from celery_semaphore import signals
from celery_semaphore.config import get_config, task_config, uses_handover
from celery_semaphore.core import parked_index
from celery_semaphore.core.connection import mask_url
from celery_semaphore.core.discovery import index_parked
from celery_semaphore.core.errors import SemaphoreError
from celery_semaphore.core.keys import semaphore_keys
from celery_semaphore.gates import semaphore_of
from celery_semaphore.state import state_of
from celery_semaphore.wire import Gate, recorded_gates
from celery_semaphore.worker.dead_children import killed

logger = logging.getLogger(__name__)

#: The field of a semaphore's meta hash the scripts keep the number of parked
#: (not yet handed over) tasks in (common.lua); status() reads it too.
PARKED_COUNT = "n_parked"

Key = tuple[str, str, Any]  # (semaphore, task id, the request's start time): one execution


def child_killed(request: Any) -> bool:
    """Whether the pool child running ``request`` was killed: its body runs no more
    (its permits were released at once), though the request is listed until the
    pool reaps the child."""
    pid = getattr(request, "worker_pid", None)
    return isinstance(pid, int) and pid > 0 and killed(pid)


def renew_interval(app: Any) -> float:
    """The shortest renewal interval any task of ``app`` asks for (per-task
    ``semaphore_lease_timeout`` / ``semaphore_heartbeat_interval`` included)."""
    intervals = [get_config(app).renew_every]
    for task in list(app.tasks.values()):
        if getattr(type(task), "semaphore_options", None):
            intervals.append(task_config(task).renew_every)
    return min(intervals)


class Heartbeat:
    """Renews the leases of the requests ``running()`` lists (worker Requests:
    ``id``, ``task``, ``time_start``, ``hostname`` and the recorded gates).

    A loss is reported (ERROR log, `celery_semaphore.signals.permit_lost`, the
    ``permits_lost_total`` metric) when, and only when, a running body's permit
    is gone: the request was seen holding at an earlier beat, and at two beats
    at least ``max_block + 1`` s apart it is still running and holds nothing.
    A request still waiting for its permit (in line, parked, in place) never
    held one; one whose child gave it back is gone from ``running()`` by the
    next beat, or its child was killed (`dead_children` released it); a
    multi-gate admission gives a permit back for at most ``max_block`` while it
    waits for another. A permit lost before any beat saw
    it held is not reported.

    ``stop(drain=True)`` keeps renewing until ``running()`` is empty: on warm
    shutdown the pool drains after the bootstep is stopped or before, depending
    on the boot order Celery picks, and the leases must outlive the last task.
    """

    def __init__(
        self,
        app: Any,
        running: Callable[[], Iterable[Any]],
        interval: float | None = None,
        revoked: Callable[[], Iterable[str]] = tuple,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.clock = clock
        self.running = running
        self.revoked = revoked
        self._dropped: set[str] = set()
        self._parked_in: set[str] = set()  # semaphores with parked messages at the last look
        self._marker: bytes | None = None
        self.interval = renew_interval(app) if interval is None else interval
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="celery-semaphore-heartbeat", daemon=True
        )
        self._held: set[Key] = set()  # seen holding at a beat, still running
        self._missing: dict[Key, float] = {}  # seen holding, then not: since when
        self._reported: set[Key] = set()

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the renewing thread still runs."""
        return self._thread.is_alive()

    def stop(self, *, drain: bool = False) -> None:
        """Stop now, or with ``drain`` once no task of this worker runs any more
        (the thread is a daemon: a worker that exits first ends it too)."""
        if drain:
            self._draining.set()
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._draining.is_set() and not list(self.running()):
                return
            try:
                self.beat()
            except Exception:  # the heartbeat must survive anything; the lease is the backstop
                logger.exception("semaphore heartbeat failed")

    def beat(self) -> None:
        """One round: renew every running request's permits, report the lost ones."""
        by_gate: dict[Gate, list[Any]] = defaultdict(list)
        for request in self.running():
            for gate in recorded_gates(request):
                by_gate[gate].append(request)
        live = set()
        for gate, requests in by_gate.items():
            task = requests[0].task
            config = task_config(task)
            try:
                lost = semaphore_of(self.app, gate, config).renew_many([r.id for r in requests])
            except SemaphoreError as error:
                logger.warning("could not renew leases of %s: %s", gate.name, error)
                continue
            for request in requests:
                key = (gate.name, request.id, getattr(request, "time_start", None))
                live.add(key)
                if request.id not in lost:
                    self._held.add(key)
                    self._missing.pop(key, None)
                elif key in self._held and not child_killed(request):
                    self._missing_now(gate, request, key, config.max_block)
        self._held &= live
        self._reported &= live
        self._missing = {k: v for k, v in self._missing.items() if k in live}
        if uses_handover(self.app):
            self.look_after_parked()

    def look_after_parked(self) -> None:
        """One dispatch call per semaphore in the parked index (see the module doc
        and `celery_semaphore.core.parked_index`; the first look also lists the
        semaphores parked in before the index, with one SCAN); then the names
        whose parked tasks are gone leave the index."""
        config = get_config(self.app)
        client = state_of(self.app).semaphores.client(config.redis_url)
        url = mask_url(config.redis_url)
        revoked = set(self.revoked())
        self._dropped &= revoked
        drop = sorted(revoked - self._dropped)
        index_parked(client, config.namespace, url)
        now_ms, entries = parked_index.read(client, config.namespace, url)
        names = [name for name, _ in entries]
        self._notice_data_loss(client, set(names), config.redis_url)
        for name in names:
            try:
                semaphore_of(self.app, Gate(name, 1), config).dispatch(drop)
            except SemaphoreError as error:
                logger.warning("could not hand over parked tasks of %s: %s", name, error)
                return
        self._dropped.update(drop)
        parked_index.forget_idle(client, config.namespace, now_ms, entries, url)

    def _notice_data_loss(self, client: Any, names: set[str], url: str) -> None:
        """A marker key (one per namespace, no expiry) changes only when Redis lost
        its data: then the tasks parked there at the last look are gone, which
        deserves an ERROR; with none parked, a WARNING (nothing was lost to wait for)."""
        marker = f"{get_config(self.app).namespace}:alive"
        token = client.get(marker)
        if token is None:
            client.set(marker, uuid.uuid4().hex, nx=True)
            token = client.get(marker)
        if self._marker is not None and token != self._marker and self._parked_in:
            logger.error(
                "Redis at %s lost its data: the tasks parked there are lost (semaphores %s); "
                "they will not run. Give that Redis persistence (appendonly yes), or drop "
                "semaphore_park_without_persistence so tasks wait in the broker instead",
                mask_url(url),
                ", ".join(sorted(self._parked_in)),
            )
        elif self._marker is not None and token != self._marker:
            logger.warning(
                "Redis at %s lost its data: no task was parked there at the last look; "
                "the permits held there are gone (more tasks than the limit may run "
                "until their holders end)",
                mask_url(url),
            )
        self._marker = token
        self._parked_in = self._with_parked_tasks(client, names)

    def _with_parked_tasks(self, client: Any, names: set[str]) -> set[str]:
        """The semaphores among ``names`` (those with a ``parked`` hash) that hold
        parked messages: the hash also keeps tasks waiting in place and arrived
        hand-overs, which a loss does not lose (their messages are with a worker or in
        the broker)."""
        namespace = get_config(self.app).namespace
        counts = {n: client.hget(semaphore_keys(namespace, n).meta, PARKED_COUNT) for n in names}
        return {name for name, count in counts.items() if count and int(count) > 0}

    def _missing_now(self, gate: Gate, request: Any, key: Key, max_block: float) -> None:
        """A request seen holding holds nothing now: lost once that lasts."""
        now = self.clock()
        since = self._missing.setdefault(key, now)
        if now - since < max(max_block + 1.0, self.interval * 0.9) or key in self._reported:
            return
        self._reported.add(key)
        logger.error(
            "permit of %s[%s] on semaphore %s is lost (lease ran out or Redis lost data)",
            request.task.name,
            request.id,
            gate.name,
        )
        with contextlib.suppress(SemaphoreError):
            semaphore_of(self.app, gate, task_config(request.task)).note_lost()
        signals.permit_lost.send(
            sender=request.task,
            semaphore=gate.name,
            task_id=request.id,
            task_name=request.task.name,
            hostname=request.hostname,
        )
