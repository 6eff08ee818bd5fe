"""The lease heartbeat: renews the permits of every running limited task of a worker.

A plain service that knows nothing of bootsteps or of the worker's state: it
is given the app and functions that list the running requests and the revoked
task ids, so the worker bootstep (``bootstep.py``) or a test can drive it. One
thread, one ``renew_many`` call per semaphore per interval.

In handover mode it also looks after parked tasks, once per interval, in every
semaphore that has some: it publishes those whose turn came while nobody called
(a lease ran out), publishes again those whose publisher died before publishing
(past ``semaphore_handover_deadline``), and drops revoked ones from the line.
When Redis loses its data (see `celery_semaphore.core.epochs`), the worker
notices through its own connection at once (a watch connection that breaks with
the restart starts a beat), not at its next beat: that beat writes the permits
of its running tasks back while admissions are paused, and the worker reports
the loss (a WARNING, the `celery_semaphore.signals.data_lost` signal and its
``semaphore-data-lost`` event); an ERROR if tasks were parked there (no
persistence, with ``semaphore_park_without_persistence``): they are lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from celery_semaphore import signals
from celery_semaphore.config import get_config, task_config, uses_handover
from celery_semaphore.core import Permit, epochs, parked_index
from celery_semaphore.core.connection import mask_url
from celery_semaphore.core.discovery import index_parked, parked_counts
from celery_semaphore.core.errors import SemaphoreConnectionError, SemaphoreError
from celery_semaphore.core.keys import watch_channel
from celery_semaphore.formats import Gate, recorded_gates
from celery_semaphore.gates import semaphore_of
from celery_semaphore.state import state_of
from celery_semaphore.worker.dead_children import killed

logger = logging.getLogger(__name__)

Key = tuple[str, str, Any]  # (semaphore, task id, the request's start time): one execution
WATCH_RETRY = 0.1  # seconds between attempts of the watch connection to connect again
WATCH_POLL = 0.2  # seconds between two looks at the watch connection
EPOCH_PROBE = "celery-semaphore-epoch"  # a semaphore name only used to learn the epoch
FOLLOW_UP = 0.25  # seconds to the next beat after one that wrote permits back
WRITTEN_BACK_TOKEN = 0  # the fencing token of a permit written back by task id (renew.lua)


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S.%f")[:-3]


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
        self._dropped: set[str] = set()
        self._parked_in: set[str] = set()  # semaphores with parked messages at the last look
        self.interval = renew_interval(app) if interval is None else interval
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._beat_now = threading.Event()
        # noticed by this process, not yet reported; with the semaphores that had
        # parked tasks at the last look before
        self._losses: list[tuple[epochs.DataLoss, set[str]]] = []
        # requests whose permits a renewal wrote back, by gate, until they end
        self._written_back: defaultdict[Gate, set[str]] = defaultdict(set)
        self._beat_soon = False  # after a write-back: look again for ended ones soon
        self._thread = threading.Thread(
            target=self._run, name="celery-semaphore-heartbeat", daemon=True
        )
        self._watch_thread = threading.Thread(
            target=self._watch, name="celery-semaphore-watch", daemon=True
        )
        self._held: set[Key] = set()  # seen holding at a beat, still running
        self._missing: dict[Key, float] = {}  # seen holding, then not: since when
        self._reported: set[Key] = set()

    def start(self) -> None:
        epochs.listen(self.notice)
        self._learn_epoch()
        self._thread.start()
        self._watch_thread.start()

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
        epochs.unlisten(self.notice)
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
                epochs.unlisten(self.notice)
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

    def _reconnected(self, connection: Any) -> None:
        self._beat_now.set()

    def notice(self, loss: epochs.DataLoss) -> None:
        """A call of this process found that Redis lost its data (`start()` has
        `celery_semaphore.core.epochs` call this): beat now, and its renewals write
        the permits back while admissions are paused."""
        self._losses.append((loss, set(self._parked_in)))
        self._beat_now.set()

    def _watch(self) -> None:
        """Holds a connection to the semaphores' Redis, subscribed to
        ``<namespace>:watch``. It breaks when Redis restarts or fails over, and once
        it connects again (redis-py's pub/sub reconnects by itself, or this loop
        makes a new one) a beat runs at once, whose calls notice a loss of the data
        if there was one. A message on the channel starts a beat too: the CLI
        publishes one (`celery_semaphore.cli.Operator.wake`) after a change that
        may admit tasks (a resume, a raised limit, a release), so the beat's
        `look_after_parked()` hands over the parked tasks it made due at once."""
        config = get_config(self.app)
        client = state_of(self.app).semaphores.client(config.redis_url)
        pubsub, broken = None, False
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                    pubsub.subscribe(watch_channel(config.namespace))
                    connection = getattr(pubsub, "connection", None)
                    if connection is not None:
                        connection.register_connect_callback(self._reconnected)
                    if broken:
                        broken = False
                        self._beat_now.set()
                # No blocking read: under gevent it would block the whole worker.
                if pubsub.get_message(timeout=0) is not None:
                    self._beat_now.set()
                self._stop.wait(WATCH_POLL)
            except Exception:  # broken, or its client closed under it: connect again
                with contextlib.suppress(Exception):
                    pubsub.close()  # type: ignore[union-attr]
                pubsub, broken = None, True
                self._stop.wait(WATCH_RETRY)
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()

    def beat(self) -> None:
        """One round: renew every running request's permits, report the lost ones."""
        by_gate: dict[Gate, list[Any]] = defaultdict(list)
        for request in self.running():
            if self.released(request):  # its child was killed: a renewal would write it back
                continue
            for gate in recorded_gates(request):
                by_gate[gate].append(request)
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
                self._written_back[gate] |= {r.id for r in requests if r.id not in lost}
                self._beat_soon = True
            for request in requests:
                key = (gate.name, request.id, getattr(request, "time_start", None))
                live.add(key)
                if request.id not in lost:
                    self._held.add(key)
                    self._missing.pop(key, None)
                elif key in self._held and not self.killed(request):
                    self._missing_now(gate, request, key, config.max_block)
        self._release_ended()
        self._held &= live
        self._reported &= live
        self._missing = {k: v for k, v in self._missing.items() if k in live}
        losses, self._losses = self._losses, []
        for loss, parked_in in losses:
            self._report(loss, restored, parked_in)
            restored = 0  # counted once, with the first loss reported
        if uses_handover(self.app):
            try:
                self.look_after_parked()
            except SemaphoreError as error:  # Redis away: the next beat looks again
                logger.warning("could not look after parked tasks: %s", error)

    def _release_ended(self) -> None:
        """Permits written back for requests that have ended since: their own release
        came first (and found nothing) or will not come, so they go back now (the
        next beat comes soon after a write-back). Only the written-back entry (token
        0) goes: a new execution of the same task id that holds a permit keeps it."""
        running = {r.id for r in self.running()}
        for gate, ids in list(self._written_back.items()):
            ended = ids - running
            if not ended:
                continue
            semaphore = semaphore_of(self.app, gate, get_config(self.app))
            for task_id in ended:
                with contextlib.suppress(SemaphoreError):
                    Permit(semaphore, task_id, WRITTEN_BACK_TOKEN, 0.0, 0.0).release()
            self._written_back[gate] = ids & running
            if not self._written_back[gate]:
                del self._written_back[gate]

    def _report(self, loss: epochs.DataLoss, restored: int, parked_in: set[str]) -> None:
        """The log line, signal and event of a data loss this process noticed."""
        parked_lost = sorted(parked_in)
        if loss.lost_at:
            paused = (
                f"no permit is granted until {_clock(loss.resumes_at)} "
                f"(a pause of {loss.pause:.1f} s from {_clock(loss.lost_at)}, when a client "
                "noticed the loss)"
            )
        else:
            paused = "admissions were not paused (no client that had seen the data noticed)"
        logger.warning(
            "Redis at %s lost its data; %s; this worker wrote back the permits of %d "
            "running limited task(s) (one that was still waiting for its permit gives "
            "back what it got at its next ask)",
            mask_url(loss.url),
            paused,
            restored,
        )
        if parked_lost:
            logger.error(
                "Redis at %s lost its data: the tasks parked there are lost (semaphores %s); "
                "they will not run. Give that Redis persistence (appendonly yes), or drop "
                "semaphore_park_without_persistence so tasks wait in the broker instead",
                mask_url(loss.url),
                ", ".join(parked_lost),
            )
        signals.data_lost.send(
            sender=self.app,
            url=mask_url(loss.url),
            hostname=self.hostname,
            restored=restored,
            paused_for=loss.pause,
            resumes_at=loss.resumes_at,
            parked_lost=parked_lost,
        )

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
        # those parked in at the last look too: the first call after a loss notices it
        for name in sorted(set(names) | self._parked_in):
            try:
                semaphore_of(self.app, Gate(name, 1), config).dispatch(drop)
            except SemaphoreConnectionError:
                raise  # Redis away: every other call would fail too; the next beat looks again
            except SemaphoreError as error:  # this semaphore only: the others are looked after
                logger.warning("could not hand over parked tasks of %s: %s", name, error)
        self._parked_in = self._with_parked_tasks(client, set(names))
        self._dropped.update(drop)
        parked_index.forget_idle(client, config.namespace, now_ms, entries, url)

    def _with_parked_tasks(self, client: Any, names: set[str]) -> set[str]:
        """The semaphores among ``names`` (those with a ``parked`` hash) that hold
        parked messages: the hash also keeps tasks waiting in place and arrived
        hand-overs, which a loss does not lose (their messages are with a worker or in
        the broker)."""
        config = get_config(self.app)
        counts = parked_counts(client, config.namespace, sorted(names), mask_url(config.redis_url))
        return {name for name, count in counts.items() if count > 0}

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
