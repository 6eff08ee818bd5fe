"""The lease heartbeat: renews the permits of every running limited task of a worker.

A plain service that knows nothing of bootsteps or of the worker's state: it
is given the app and functions that list the running requests and the revoked
task ids, so the worker bootstep (``bootstep.py``) or a test can drive it. One
thread, one ``renew_many`` call per semaphore per interval; a running body whose
permit is gone is reported lost (see `Heartbeat`).

Each beat also runs what the worker does besides, each in a module of its own:
- in handover mode, it looks after parked tasks (`celery_semaphore.worker.parked_look`);
- when Redis loses its data (see `celery_semaphore.core.redis.epochs`), the worker
  notices through its own connection at once (`celery_semaphore.worker.watch`), not at
  its next beat: that beat writes the permits of its running tasks back while
  admissions are paused, and reports the loss (`celery_semaphore.worker.data_loss`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from celery_semaphore import signals
from celery_semaphore.config import get_config, task_config, uses_handover
from celery_semaphore.core import losses
from celery_semaphore.core.errors import SemaphoreError
from celery_semaphore.core.results import DataLoss
from celery_semaphore.formats import Gate, recorded_gates
from celery_semaphore.gates import semaphore_of
from celery_semaphore.parking_queues import sweep
from celery_semaphore.state import state_of
from celery_semaphore.worker.data_loss import WrittenBack, report_loss
from celery_semaphore.worker.dead_children import killed
from celery_semaphore.worker.parked_look import ParkedLook
from celery_semaphore.worker.parked_rebuild import rebuild
from celery_semaphore.worker.watch import Watch

logger = logging.getLogger(__name__)

Key = tuple[str, str, Any]  # (semaphore, task id, the request's start time): one execution
EPOCH_PROBE = "celery-semaphore-epoch"  # a semaphore name only used to learn the epoch
FOLLOW_UP = 0.25  # seconds to the next beat after one that wrote permits back
#: Seconds after a rebuild that followed a data loss before the parking queues are read
#: once more: a task whose place was made before the loss and whose message reached its
#: parking queue after the first read has a place only then.
REBUILD_AGAIN_AFTER = 2.0


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
        *,
        revoked: Callable[[], Iterable[str]] = tuple,
        clock: Callable[[], float] = time.monotonic,
        hostname: str | None = None,
        killed: Callable[[Any], bool] = child_killed,
        released: Callable[[Any], bool] = lambda request: False,
    ) -> None:
        self.app = app
        self.hostname = hostname
        self.killed = killed  # its child was killed: no loss report
        self.released = released  # its permits were released for that: not renewed
        self.clock = clock
        self.running = running
        self.revoked = revoked
        self.parked = ParkedLook(app, revoked)
        self.interval = renew_interval(app) if interval is None else interval
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._beat_now = threading.Event()
        # noticed by this process, not yet reported; with the semaphores that had
        # parked tasks at the last look before
        self._losses: list[tuple[DataLoss, set[str]]] = []
        self._written_back = WrittenBack(app)
        self._beat_soon = False  # after a write-back: look again for ended ones soon
        self._rebuilt = False  # the parked tasks' places, looked at once at the start
        self._rebuild_again_at: float | None = None  # after a loss: read them once more
        self._thread = threading.Thread(
            target=self._run, name="celery-semaphore-heartbeat", daemon=True
        )
        self._watch = Watch(app, self._beat_now.set, self._stop)
        self._held: set[Key] = set()  # seen holding at a beat, still running
        self._missing: dict[Key, float] = {}  # seen holding, then not: since when
        self._reported: set[Key] = set()

    def start(self) -> None:
        losses.listen(self.notice)
        self._learn_epoch()
        self._thread.start()
        self._watch.start()

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
        self._beat_now.set()
        losses.unlisten(self.notice)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            soon, self._beat_soon = self._beat_soon, False
            self._beat_now.wait(min(self.interval, FOLLOW_UP) if soon else self.interval)
            self._beat_now.clear()
            if self._stop.is_set():
                return
            if self._draining.is_set() and not list(self.running()):
                self._stop.set()
                losses.unlisten(self.notice)
                return
            try:
                self.beat()
            except Exception:  # the heartbeat must survive anything; the lease is the backstop
                logger.exception("semaphore heartbeat failed")

    def _learn_epoch(self) -> None:
        """The data epoch of the semaphores' Redis, learnt before this worker runs
        anything: else a loss before the first beat would pass for a first use (on
        a Cluster, of one slot only; the others at the worker's first call there)."""
        config = get_config(self.app)
        try:
            semaphore_of(self.app, Gate(EPOCH_PROBE, 1), config).learn_epoch()
            state_of(self.app).redis_answered.set()
        except SemaphoreError as error:
            logger.warning("could not read the data epoch of the semaphores' Redis: %s", error)

    def notice(self, loss: DataLoss) -> None:
        """A call of this process found that Redis lost its data (`start()` has
        `celery_semaphore.core.redis.epochs` call this): beat now, and its renewals write
        the permits back while admissions are paused."""
        self._losses.append((loss, set(self.parked.parked_in)))
        self._beat_now.set()

    def beat(self) -> None:
        """One round: renew every running request's permits, report the lost ones."""
        by_gate: dict[Gate, list[Any]] = defaultdict(list)
        for request in self.running():
            if self.released(request):  # its child was killed: a renewal would write it back
                continue
            for gate in recorded_gates(request):
                by_gate[gate].append(request)
                self.parked.learn(gate.name, request.task)
        live = set()
        restored = 0
        for gate, requests in by_gate.items():
            task = requests[0].task
            config = task_config(task)
            semaphore = semaphore_of(self.app, gate, config)
            before = semaphore.restored
            try:
                lost = semaphore.renew_many([r.id for r in requests], weight=gate.weight)
            except SemaphoreError as error:
                logger.warning("could not renew leases of %s: %s", gate.name, error)
                continue
            finally:
                restored += semaphore.restored - before
            if semaphore.restored > before:
                self._written_back.add(gate, (r.id for r in requests if r.id not in lost))
                self._beat_soon = True
            for request in requests:
                key = (gate.name, request.id, getattr(request, "time_start", None))
                live.add(key)
                if request.id not in lost:
                    self._held.add(key)
                    self._missing.pop(key, None)
                elif key in self._held and not self.killed(request):
                    self._missing_now(gate, request, key, config.max_block)
        self._written_back.release_ended({r.id for r in self.running()})
        self._held &= live
        self._reported &= live
        self._missing = {k: v for k, v in self._missing.items() if k in live}
        losses, self._losses = self._losses, []
        in_broker = uses_handover(self.app) and self.parks_in_broker()
        for loss, parked_in in losses:
            # parked in the broker: nothing lost, their places are given back below
            report_loss(self.app, self.hostname, loss, restored, set() if in_broker else parked_in)
            restored = 0  # counted once, with the first loss reported
        if in_broker:
            self.place_broker_parked(lost=bool(losses))
        if in_broker and state_of(self.app).parking.broker_driver(self.app) == "redis":
            self.sweep_moving()
        if uses_handover(self.app):
            try:
                self.look_after_parked()
            except SemaphoreError as error:  # Redis away: the next beat looks again
                logger.warning("could not look after parked tasks: %s", error)

    def place_broker_parked(self, *, lost: bool) -> None:
        """Give the tasks parked in the broker their places: at the start (those of a
        loss while no worker ran), after a loss this worker noticed (``lost``), and once
        more `REBUILD_AGAIN_AFTER` s later (a place made before the loss whose message
        reached its parking queue after the first read)."""
        if lost or not self._rebuilt:
            self._rebuilt = self.rebuild_parked(only_short=not lost)  # else: next beat
            if lost:
                self._rebuild_again_at = self.clock() + REBUILD_AGAIN_AFTER
            return
        again = self._rebuild_again_at
        if again is not None and self.clock() >= again and self.rebuild_parked():
            self._rebuild_again_at = None

    def parks_in_broker(self) -> bool:
        """Whether the app's parked tasks wait in its broker's parking queues."""
        return state_of(self.app).parking.in_broker(self.app, get_config(self.app))

    def sweep_moving(self) -> None:
        """Put back the parked messages a process stopped moving (a Redis broker:
        `celery_semaphore.parking_lists`)."""
        try:
            sweep(state_of(self.app).semaphores.broker_link, get_config(self.app).namespace)
        except Exception as error:  # the broker away: the next beat
            logger.warning("could not look for parked messages stopped mid-move: %r", error)

    def rebuild_parked(self, *, only_short: bool = False) -> bool:
        """Give the tasks parked in the broker that have no place in line their places
        (`celery_semaphore.worker.parked_rebuild`); whether it could (else the next beat
        tries again)."""
        try:
            placed = rebuild(self.app, only_short=only_short)
        except Exception as error:  # the broker or Redis away: the next beat
            logger.warning("could not give the tasks parked in the broker their places: %r", error)
            return False
        if placed:
            logger.warning(
                "gave %d task(s) parked in the broker their places in line again", placed
            )
        return True

    def look_after_parked(self) -> None:
        """Look after the parked tasks now (`ParkedLook.look`); a beat does it too."""
        self.parked.look()

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
