"""What the plugin keeps for each Celery app, in one object on the app.

``state_of(app)`` is an `AppState` stored as ``app.semaphore_state``:

- ``config``: the ``semaphore_*`` settings, read and validated once;
- ``task_configs``: each task's settings with its own options applied;
- ``semaphores``: this process's stores and semaphores (one per URL / gate);
- ``publish_paused_until``: after a failed place-taking at publish, none are
  taken until then (publishing never stalls on Redis);
- ``room_at_publish``: the room last seen in each line published to, while new
  tasks skip their place at publish (`celery_semaphore.room_at_publish`);
- ``parking``: whether tasks may park in that Redis (its persistence, read
  once a minute) and whether the process warned that they may not.

`reset()` drops all of it, for a test (or a program) that changes the
app's settings, or its Redis, after first use. The one thing kept across apps is
`installed_apps`: the apps `celery_semaphore.install()` was called on,
where the publish handler looks the published task up.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakSet

from .config import SemaphoreConfig, forget_config
from .core import Semaphore
from .core.operations import OperatedStore, operated_store
from .core.protocol import PAUSE_MARGIN
from .core.rates import RateLimit
from .durability import ParkingSafety
from .parked_tasks import Publisher
from .parking_queues import BrokerLink
from .room_at_publish import RoomAtPublish

ATTRIBUTE = "semaphore_state"
QUICK_TIMEOUT = 0.25

installed_apps: WeakSet[Any] = WeakSet()


def _store(url: str, quick: bool) -> OperatedStore:
    return operated_store(url, quick_timeout=QUICK_TIMEOUT if quick else None)


class Semaphores:
    """One store per URL and one `Semaphore` per gate (the last
    ``MOST_SEMAPHORES`` used), in this process.

    With an app, each semaphore publishes the parked tasks it hands over
    (`celery_semaphore.parked_tasks`), whatever the wait mode: a task of its own
    may park in a countdown-mode app (``semaphore_wait_mode`` per task), and
    another task's release must hand it over. redis-py connection pools notice a fork
    and reconnect in the child.
    """

    #: Semaphores kept, the least recently used dropped past it. A key function
    #: makes one per key (customer, tenant, ...), which would otherwise pile up
    #: for the life of a worker or publisher. A process uses at once only the gates
    #: of the tasks it runs or publishes (a few per task, times the pool's
    #: concurrency); a dropped one is made again on its next use without asking
    #: Redis (its client, and the client's scripts, are kept).
    MOST_SEMAPHORES = 1024

    def __init__(self, app: Any = None) -> None:
        self.app = app
        # Taken only to make a client or a semaphore: a worker forks its pool while
        # its heartbeat thread runs, and a child that inherits it held would hang.
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, bool], OperatedStore] = {}
        self._semaphores: OrderedDict[tuple[Any, ...], Semaphore] = OrderedDict()
        #: This process's confirmed connection to the broker, where tasks park in
        #: parking queues (`celery_semaphore.parking_queues`); connects on first use.
        self.broker_link = BrokerLink(app)

    def get(
        self,
        name: str,
        limit: int,
        config: SemaphoreConfig,
        *,
        quick: bool = False,
        family: str = "",
        rate: RateLimit | None = None,
        shadow: frozenset[str] = frozenset(),
    ) -> Semaphore:
        """Semaphore ``name``; ``quick``: on a store whose client gives up within
        `QUICK_TIMEOUT` s, for callers that must never stall (publishing)."""
        key = (config.redis_url, config.namespace, name, limit, config.lease_timeout, quick,
               config.max_block, config.handover_deadline, family, config.renew_every,
               rate, shadow)  # fmt: skip
        semaphore = self._semaphores.get(key)
        if semaphore is not None:  # no lock: see _lock
            with suppress(KeyError):  # dropped by another thread meanwhile
                self._semaphores.move_to_end(key)
            return semaphore
        store = self.store(config.redis_url, quick=quick)
        with self._lock:
            on_handover = None if self.app is None else Publisher(self.app, self.broker_link)
            semaphore = self._semaphores[key] = Semaphore(
                store,
                name,
                limit,
                lease_timeout=config.lease_timeout,
                namespace=config.namespace,
                on_handover=on_handover,
                handover_window=config.handover_window,
                handover_deadline=config.handover_deadline,
                family=family,
                rate=rate,
                shadow=shadow,
                # a worker whose heartbeat noticed a loss only at its next beat
                # still writes its permits back in time
                pause_after_loss=config.renew_every + PAUSE_MARGIN,
            )
            if on_handover is not None:
                on_handover.semaphore = semaphore
            if len(self._semaphores) > self.MOST_SEMAPHORES:
                self._semaphores.popitem(last=False)
            return semaphore

    def store(self, url: str, *, quick: bool = False) -> OperatedStore:
        """This process's store at ``url`` (``quick``: the one that gives up soon)."""
        with self._lock:
            store = self._stores.get((url, quick))
            if store is None:
                store = self._stores[(url, quick)] = _store(url, quick)
            return store

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()
            self._semaphores.clear()
        self.broker_link.reset()


class SharedFlag:
    """A flag shared by a process and the children it forks after making it (one byte
    of anonymous shared memory): what any of them sets, all of them see. A worker
    makes its app's state before it forks its pool."""

    def __init__(self) -> None:
        self._byte = mmap.mmap(-1, 1)

    def __bool__(self) -> bool:
        return self._byte[0] == 1

    def set(self) -> None:
        if self._byte[0] != 1:
            self._byte[0] = 1


@dataclass
class AppState:
    semaphores: Semaphores
    publish_paused_until: float = 0.0
    #: The room this process last saw in each line it published to: new tasks skip
    #: their place while it lasts (`celery_semaphore.room_at_publish`).
    room_at_publish: RoomAtPublish = field(default_factory=RoomAtPublish)
    #: Whether this process is a worker started with ``-E`` (task events): what
    #: ``semaphore_send_events = None`` follows. Set by the worker bootstep.
    worker_events: bool = False
    #: Whether tasks may park in the semaphores' Redis: its persistence as read, and
    #: whether this process warned that they may not (`celery_semaphore.durability`).
    parking: ParkingSafety = field(default_factory=ParkingSafety)
    #: Whether the semaphores' Redis has answered this worker (any of its processes)
    #: since it started. Until it has, a task that cannot reach it fails instead of
    #: retrying (`celery_semaphore.admission`).
    redis_answered: SharedFlag = field(default_factory=SharedFlag)
    #: Whether this worker's pool processes may keep permits between tasks (its pool
    #: is prefork, solo or threads; set by the worker bootstep), and this process's
    #: kept permits (`celery_semaphore.kept_permits.keeper_of`).
    keeps_permits: bool = False
    keeper: Any = None
    #: The gates whose permits this worker's children may keep, noted as their
    #: requests arrive (`celery_semaphore.worker.kept_of_children`).
    kept_gates: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    #: Whether the tasks' declared limits were compared (`celery_semaphore.gates`).
    limits_checked: bool = False
    #: The gates' names that one script call cannot reach together, warned of once
    #: (`celery_semaphore.gates.joint_of`).
    joint_warned: set[tuple[str, ...]] = field(default_factory=set)
    #: The gates of requests of tasks whose gates do not depend on their arguments,
    #: per (task name, queue, priority): (the task's declared limits, its gates)
    #: (`celery_semaphore.gates.request_gates`).
    constant_gates: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)


_create_lock = threading.Lock()


def state_of(app: Any) -> AppState:
    """The plugin's state for ``app`` (made on first use)."""
    state: AppState | None = app.__dict__.get(ATTRIBUTE)
    if state is None:
        with _create_lock:
            state = app.__dict__.setdefault(ATTRIBUTE, AppState(Semaphores(app)))
    return state


def reset(app: Any) -> None:
    """Forget what the plugin keeps for ``app``: settings (read again from
    ``app.conf`` on next use), per-task settings, stores, the publish pause.

    For tests that change an app's settings or point it at another Redis
    between runs. Harmless on an app the plugin never saw.
    """
    forget_config(app)
    state: AppState | None = app.__dict__.pop(ATTRIBUTE, None)
    if state is not None:
        state.semaphores.close()
