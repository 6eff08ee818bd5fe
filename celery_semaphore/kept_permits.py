"""Kept permits: a pool process keeps its permit between tasks while nobody waits.

With ``semaphore_keep_idle`` > 0, a process (prefork child, solo worker, or each thread
of a thread pool) that ends a limited task asks the store to keep the permit instead of
releasing it (`Permit.keep`: one call, the release it replaces). The store keeps it only
while nobody waits, with no rate and no shadow limit, within the limit
(`celery_semaphore.core.model.kept`); it then holds as ``kept|<worker>|<pid>|...``, which
`status`, ``holders`` and the metrics show apart. The next task of the same gate in
this process starts on it without asking the store; it is given back:

- when a line forms: the first waiter of an empty line publishes on the semaphore's wake
  channel, which this process's keeper thread listens to. An idle kept permit goes back
  at once (its release hands the turn over), a busy one when its task ends;
- when it has been idle ``semaphore_keep_idle`` seconds;
- when the process stops taking tasks (``worker_process_shutdown``), and by the worker's
  main process for a child that died (`celery_semaphore.worker.kept_of_children`);
- at every renewal interval (a quarter of the lease unless set), as if a line had
  formed: the next task's end keeps it again if nobody waits, so a message the
  keeper missed costs at most that long. The keeper renews the lease of one a task
  runs on meanwhile, and the end of its lease is the backstop (a worker killed).

Only a request with one gate, no rate, no shadow limit, no fair key and no place in a
line (it never waited) uses or keeps one; any other takes the ordinary path.

What a task that starts on a kept permit can overtake: the waiters that joined the line
after the keeper last heard its wake channel, for as long as the news takes to arrive
(a publish and a read: about a millisecond on one machine); a task already running on a
kept permit finishes, as any running task does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .config import SemaphoreConfig
from .core import Permit, Semaphore, SemaphoreError
from .core.constants import ANY_CHANNEL, KEPT_PREFIX
from .formats import Gate, WaitState
from .state import ATTRIBUTE, installed_apps

logger = logging.getLogger(__name__)

#: The longest the keeper thread reads its wake channels before it looks at what it
#: should listen to, renew and give back.
LOOK_EVERY = 0.05
#: The semaphores whose wake channels a process listens to at most (the latest used).
MOST_LISTENED = 64
#: How often the keeper thread looks for renewals due while it keeps nothing (s).
IDLE_TICK = 1.0


def kept_holder(hostname: str | None, pid: int, gate: Gate, thread: int | None = None) -> str:
    """The holder id of the permit a process keeps for ``gate`` (one per gate and
    weight; a thread pool's threads each keep their own)."""
    where = str(pid) if thread is None else f"{pid}.{thread}"
    return f"{KEPT_PREFIX}{hostname or ''}|{where}|{gate.weight}|{gate.name}"


def keepable(gates: list[Gate]) -> bool:
    """Whether a request with these gates may keep its permit when it ends: one gate
    with only a concurrency limit (the store decides the rest)."""
    if len(gates) != 1:
        return False
    gate = gates[0]
    return gate.rate is None and not gate.shadow and gate.fair_key is None


def may_start_on_kept(state: WaitState) -> bool:
    """Whether a request (of a `keepable` gate) may start on a kept permit: one that
    never waited and holds no place in a line (a ticket it carries is its publish
    time at most)."""
    return state.waits == 0 and state.handover is None and (state.unplaced or not state.tickets)


@dataclass
class Kept:
    key: tuple[Any, ...]
    gate: Gate
    semaphore: Semaphore
    permit: Permit
    #: Its task's ``semaphore_keep_idle`` and renewal interval.
    idle: float
    renew_every: float
    #: When it went idle (monotonic), None while a task runs on it.
    idle_since: float | None
    #: A line formed while a task ran on it: given back when that task ends.
    recalled: bool = False


class Keeper:
    """The kept permits of one process, and the thread that listens, renews and gives
    back. Made on first use in each process (`keeper_of`)."""

    def __init__(self, hostname: str | None) -> None:
        self.hostname = hostname
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._kept: dict[tuple[Any, ...], Kept] = {}
        #: The semaphores this process kept permits of or tried to (the latest
        #: `MOST_LISTENED`): the keeper thread listens to their wake channels from the
        #: first try on, so a task's end never waits for a subscription again.
        self._wanted: OrderedDict[Semaphore, None] = OrderedDict()
        #: Those it listens to now, and each wake channel's semaphores.
        self._listening: frozenset[Semaphore] = frozenset()
        self._channels: dict[str, set[Semaphore]] = {}
        self._listened = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # The task's side --------------------------------------------------------------

    def holder_for(self, gate: Gate) -> str:
        thread = None if threading.current_thread() is threading.main_thread() else (
            threading.get_ident()
        )  # fmt: skip
        return kept_holder(self.hostname, self.pid, gate, thread)

    def _key(self, gate: Gate) -> tuple[Any, ...]:
        return (self.holder_for(gate), gate.limit)

    def take(self, gate: Gate) -> Kept | None:
        """The kept permit of ``gate``, now busy, if this process keeps one that is
        idle, not recalled, and not near its lease's end."""
        with self._lock:
            kept = self._kept.get(self._key(gate))
            if kept is None or kept.idle_since is None or kept.recalled:
                return None
            if kept.permit.expires_at - time.time() < kept.renew_every:
                return None  # the keeper renews it, or it runs out: the ordinary path
            kept.idle_since = None
            return kept

    def put_back(self, kept: Kept) -> None:
        """A task on ``kept`` ended: idle again, or given back if a line formed."""
        with self._lock:
            recalled = kept.recalled
            if recalled:
                self._kept.pop(kept.key, None)
            else:
                kept.idle_since = time.monotonic()
        if recalled:
            self._give_back(kept)

    def keep(
        self, gate: Gate, semaphore: Semaphore, permit: Permit, info: str, config: SemaphoreConfig
    ) -> str | None:
        """The task that held ``permit`` ended: keep it if the store lets us. "kept",
        "released" (someone waits, or keeping would cost something), "lost" (it was
        gone), or None: the store did not answer (logged; the lease runs out)."""
        self._listen_to(semaphore)
        try:
            result = permit.keep(self.holder_for(gate), info)
        except SemaphoreError as error:
            logger.warning("could not release %r (its lease will run out): %s", permit, error)
            return None
        if isinstance(result, bool):
            return "released" if result else "lost"
        key = self._key(gate)
        with self._lock:
            self._kept[key] = Kept(
                key, gate, semaphore, result, config.keep_idle, config.renew_every,
                time.monotonic(),
            )  # fmt: skip
        return "kept"

    # The keeper thread ------------------------------------------------------------

    def _listen_to(self, semaphore: Semaphore) -> None:
        """Return once the keeper thread listens to ``semaphore``'s wake channel (at
        once from its second keep on; the first waits for a subscription, at most a
        second), so that a line forming after the permit is kept is heard."""
        with self._lock:
            if semaphore in self._listening:
                self._wanted.move_to_end(semaphore)
                return
            self._wanted[semaphore] = None
            while len(self._wanted) > MOST_LISTENED:
                self._wanted.popitem(last=False)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-semaphore-keeper", daemon=True
                )
                self._thread.start()
            self._wake.set()
            deadline = time.monotonic() + 1.0
            while semaphore not in self._listening and time.monotonic() < deadline:
                self._listened.wait(LOOK_EVERY)

    def _run(self) -> None:
        subscription: Any = None
        store: Any = None
        last_renewal = time.monotonic()
        while not self._stop.is_set():
            try:
                with self._lock:
                    wanted = frozenset(self._wanted) | {k.semaphore for k in self._kept.values()}
                if wanted != self._listening:
                    if subscription is not None:
                        store.unlisten(subscription, keep=False)
                        subscription = None
                    store = next(iter(wanted)).store
                    subscription = store.listen([s.spec for s in wanted])
                    channels: dict[str, set[Semaphore]] = {}
                    for semaphore in wanted:
                        channels.setdefault(store.wake_channel(semaphore.spec), set()).add(
                            semaphore
                        )
                    with self._lock:
                        had, self._listening, self._channels = self._listening, wanted, channels
                        self._listened.notify_all()
                    if had:  # a message between the two subscriptions went unheard
                        self.recall()
                if subscription is None:
                    self._wake.wait(LOOK_EVERY)
                    self._wake.clear()
                else:
                    channel = store.wait_for_message(subscription, LOOK_EVERY)
                    if channel is not None:
                        self.recall(None if channel == ANY_CHANNEL else channel)
                if time.monotonic() - last_renewal >= self._renew_every():
                    last_renewal = time.monotonic()
                    self.renew()
                    self.recall()
                self.give_back_idle()
            except Exception as error:  # never silent: logged, and every kept permit given back
                logger.warning("celery-semaphore keeper: %s; giving kept permits back", error)
                if subscription is not None:
                    with contextlib.suppress(Exception):
                        store.unlisten(subscription, keep=False)
                subscription = None
                with self._lock:
                    self._listening = frozenset()
                self.recall()
                self._stop.wait(LOOK_EVERY)

    def _renew_every(self) -> float:
        with self._lock:
            return min((k.renew_every for k in self._kept.values()), default=IDLE_TICK)

    def recall(self, channel: str | None = None) -> None:
        """A line formed or an operator changed the semaphore of wake channel
        ``channel`` (None: any, or the keeper cannot tell): its idle kept permits go back
        now, busy ones when their tasks end."""
        with self._lock:
            hit = None if channel is None else self._channels.get(channel, set())
            mine = {key: k for key, k in self._kept.items() if hit is None or k.semaphore in hit}
            gone = [self._kept.pop(key) for key, k in mine.items() if k.idle_since is not None]
            for kept in mine.values():
                kept.recalled = True
        for kept in gone:
            self._give_back(kept)

    def give_back_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [
                key
                for key, k in self._kept.items()
                if k.idle_since is not None and now - k.idle_since >= k.idle
            ]
            gone = [self._kept.pop(key) for key in due]
        for kept in gone:
            self._give_back(kept)

    def renew(self) -> None:
        """Extend the lease of every kept permit a task runs on: one call per semaphore
        (the idle ones go back next: `recall`). One found lost (its lease ran out, the
        store lost its data) is no longer kept."""
        with self._lock:
            held = [k for k in self._kept.values() if k.idle_since is None]
        by_semaphore: dict[Semaphore, list[Kept]] = {}
        for kept in held:
            by_semaphore.setdefault(kept.semaphore, []).append(kept)
        for semaphore, group in by_semaphore.items():
            try:
                lost = semaphore.renew_many([k.permit for k in group])
            except SemaphoreError as error:
                logger.warning("could not renew kept permits of %s: %s", semaphore.name, error)
                continue
            if lost:
                logger.warning("kept permits of %s lost: %s", semaphore.name, sorted(lost))
                with self._lock:
                    for k in group:
                        if k.permit.holder in lost:
                            self._kept.pop(k.key, None)

    def give_back_all(self) -> None:
        """The process stops taking tasks: every kept permit goes back."""
        self._stop.set()
        with self._lock:
            gone = list(self._kept.values())
            self._kept.clear()
        for kept in gone:
            self._give_back(kept)

    def _give_back(self, kept: Kept) -> None:
        try:
            kept.permit.release()
        except SemaphoreError as error:
            logger.warning(
                "could not give back %r (its lease will run out): %s", kept.permit, error
            )


def keeper_of(state: Any, hostname: str | None) -> Keeper:
    """This process's `Keeper` (a forked child makes its own: its parent's thread and
    permits are not its own)."""
    keeper: Keeper | None = state.keeper
    if keeper is None or keeper.pid != os.getpid():
        keeper = state.keeper = Keeper(hostname)
    return keeper


def give_back_kept(app: Any) -> None:
    """This process stops taking tasks: its kept permits of ``app`` go back."""
    state = app.__dict__.get(ATTRIBUTE)
    keeper: Keeper | None = None if state is None else state.keeper
    if keeper is not None and keeper.pid == os.getpid():
        keeper.give_back_all()


def on_process_end(**_: Any) -> None:
    """``worker_process_shutdown``: a pool child exits (warm shutdown, or its
    ``worker_max_tasks_per_child``)."""
    for app in list(installed_apps):
        give_back_kept(app)
