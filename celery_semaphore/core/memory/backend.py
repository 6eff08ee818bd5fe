"""The memory store's state: one reference model per semaphore, behind one lock, and
the model's replies turned into the values of `celery_semaphore.core.results`.

Time is the process's wall clock, read once per operation, as a script reads the
server's. What an operation publishes on a semaphore's wake channel in the model (a
permit granted to a waiter in place, the tickets now admissible) goes into the
store's `Messages`, which a waiting `wait_for_wakeup` reads, as a Redis waiter reads
its channel. The semaphores of one namespace share one epoch (as one Redis does); a
memory store never loses its data, so nothing is ever paused after a loss.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from celery_semaphore.core import model
from celery_semaphore.core.errors import StaleHandover
from celery_semaphore.core.model import Caller, SemaphoreModel
from celery_semaphore.core.model.epochs import Epochs
from celery_semaphore.core.model.joint import Part
from celery_semaphore.core.model.joint import acquire_all as model_acquire_all
from celery_semaphore.core.protocol import SemaphoreSpec
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.readings import (
    claimed_of,
    enqueued_place,
    grant_of,
    place_of,
    semaphore_status,
)
from celery_semaphore.core.requests import (
    Acquire,
    AcquireAll,
    Claim,
    Configure,
    Enqueue,
    Park,
    Release,
    Renew,
)
from celery_semaphore.core.results import (
    Claimed,
    Grant,
    Handover,
    Parked,
    Place,
    Places,
    SemaphoreStatus,
)


def now_us() -> int:
    return time.time_ns() // 1000


def model_rate(rate: RateLimit | None) -> model.Rate | None:
    return None if rate is None else model.Rate(rate.interval_us, rate.burst)


def caller_of(spec: SemaphoreSpec) -> Caller:
    """What a client of these settings declares with its calls."""
    return Caller(
        pause_ms=max(1, int(spec.pause_after_loss * 1000)),
        limit=spec.limit,
        rate=model_rate(spec.rate),
        shadow=spec.shadow_codes,
        sent_horizon_ms=spec.sent_horizon_ms,
        dispatch=spec.dispatch,
    )


def handovers_of(modelled: SemaphoreModel) -> list[Handover]:
    return [Handover(h.holder, h.token, h.payload, h.delay_ms / 1000) for h in modelled.handovers]


Key = tuple[str, str]  # (namespace, name)


class Messages:
    """What the operations published on each semaphore's wake channel, numbered in one
    sequence; of each semaphore the `KEPT` last ones at least (a waiter reads those
    after the number it last saw)."""

    KEPT = 1_000

    def __init__(self) -> None:
        self.last = 0
        self.kept: dict[Key, list[tuple[int, model.Published]]] = {}
        #: Of each semaphore, the number of the last message dropped (0: none).
        self.dropped: dict[Key, int] = {}

    def publish(self, key: Key, published: Sequence[model.Published]) -> None:
        kept = self.kept.setdefault(key, [])
        for message in published:
            self.last += 1
            kept.append((self.last, message))
        if len(kept) > 2 * self.KEPT:
            self.dropped[key] = kept[-self.KEPT - 1][0]
            del kept[: -self.KEPT]

    def since(self, seen: int, keys: frozenset[Key]) -> list[tuple[int, model.Published]]:
        """The messages of ``keys`` numbered after ``seen``, in order; one that wakes
        everybody first if some of them were dropped meanwhile (the waiter asks again)."""
        found: list[tuple[int, model.Published]] = []
        for key in keys:
            kept = self.kept.get(key, [])
            if self.dropped.get(key, 0) > seen:
                found.append((self.dropped[key], model.WakeUp(None)))
            found += kept[bisect.bisect_right(kept, seen, key=lambda entry: entry[0]) :]
        return sorted(found, key=lambda entry: entry[0])

    def forget(self, key: Key) -> None:
        self.kept.pop(key, None)
        self.dropped.pop(key, None)


class Backend:
    """The semaphores of one ``memory://`` URL in this process."""

    #: Seconds between two looks for semaphores idle past their ``idle_ttl``.
    SWEEP_EVERY = 1.0

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.models: dict[Key, SemaphoreModel] = {}
        self.epochs: dict[str, Epochs] = {}  # by namespace
        self.messages = Messages()
        #: Of each semaphore, when it was last used and how long it may stay idle (ms).
        self.used: dict[Key, tuple[int, int]] = {}
        #: Of each semaphore, the family its users declare ('': none).
        self.families: dict[Key, str] = {}
        #: The watches of the operators' commands (`MemoryOperations.watch`).
        self.watching: weakref.WeakSet[Any] = weakref.WeakSet()
        self._swept = 0.0

    def model_of(self, spec: SemaphoreSpec) -> SemaphoreModel:
        """The model of ``spec``'s semaphore (new if it is not there, or went idle),
        used now; the caller holds the lock."""
        key = (spec.namespace, spec.name)
        self.forget_idle()
        if key not in self.models:
            epochs = self.epochs.setdefault(spec.namespace, Epochs())
            self.models[key] = SemaphoreModel(epochs)
        self.used[key] = (now_us() // 1000, spec.idle_ms)
        if spec.family:
            self.families[key] = spec.family
        return self.models[key]

    def forget_idle(self) -> None:
        """Forget the semaphores unused for longer than their ``idle_ttl`` (as Redis lets
        their keys expire), at most every `SWEEP_EVERY` s."""
        if time.monotonic() - self._swept < self.SWEEP_EVERY:
            return
        self._swept = time.monotonic()
        now_ms = now_us() // 1000
        for key, (used_ms, idle_ms) in list(self.used.items()):
            if now_ms - used_ms > idle_ms:
                del self.used[key], self.models[key]
                self.families.pop(key, None)
                self.messages.forget(key)

    def told(self, spec: SemaphoreSpec, modelled: SemaphoreModel) -> list[Handover]:
        """What the last call on ``modelled`` published (kept for the waiters), and the
        waiters it handed over."""
        self.messages.publish((spec.namespace, spec.name), modelled.published)
        return handovers_of(modelled)


def acquire(
    backend: Backend, spec: SemaphoreSpec, asked: Acquire
) -> tuple[Grant | Place, list[Handover]]:
    with backend.lock:
        modelled, now = backend.model_of(spec), now_us()
        reply = modelled.attempt(
            caller_of(spec), asked.holder, now, lease_ms=asked.lease_ms,
            waiter_lease_ms=asked.wait_ms, ticket=asked.ticket, ask=asked.ask, info=asked.info,
            handover=asked.handover, in_place=asked.in_place,
        )  # fmt: skip
        if isinstance(reply, model.Stale):
            raise StaleHandover(spec.name, reply.token)
        handovers = backend.told(spec, modelled)
        if isinstance(reply, model.Granted):
            return grant_of(reply), handovers
        return place_of(reply, now // 1000, hold_ms=modelled.hold_ms or 0), handovers


def park(backend: Backend, spec: SemaphoreSpec, asked: Park) -> tuple[Parked, list[Handover]]:
    with backend.lock:
        modelled, now = backend.model_of(spec), now_us()
        place = modelled.park(
            caller_of(spec), asked.holder, asked.payload, now, park_lease_ms=asked.park_ms,
            ticket=asked.ticket, info=asked.info, due_ms=asked.due_ms, ask=asked.ask,
        )  # fmt: skip
        return Parked(place.ticket, place.position), backend.told(spec, modelled)


def claim(backend: Backend, spec: SemaphoreSpec, asked: Claim) -> Claimed:
    with backend.lock:
        modelled = backend.model_of(spec)
        claimed = modelled.claim(caller_of(spec), asked.taken, asked.handed, asked.token, now_us())
        return claimed_of(claimed)


def enqueue(
    backend: Backend, spec: SemaphoreSpec, asked: Enqueue
) -> tuple[Place, bool, list[Handover]]:
    far = asked.far
    park_if_far = None
    if far is not None and spec.dispatch is not None:
        park_if_far = model.ParkIfFar(
            far.window_us, far.head, far.tail, far.park_ms, spec.dispatch, far.due_ms
        )
    with backend.lock:
        modelled, now = backend.model_of(spec), now_us()
        place = modelled.take_place(
            caller_of(spec), asked.holder, now, waiter_lease_ms=asked.wait_ms, ask=asked.ask,
            info=asked.info, park_if_far=park_if_far,
        )  # fmt: skip
        return enqueued_place(place), place.parked, backend.told(spec, modelled)


def dispatch(backend: Backend, spec: SemaphoreSpec, drop: Sequence[str]) -> list[Handover]:
    with backend.lock:
        modelled = backend.model_of(spec)
        modelled.dispatch(caller_of(spec), now_us(), tuple(drop))
        return backend.told(spec, modelled)


def release(backend: Backend, spec: SemaphoreSpec, asked: Release) -> tuple[int, list[Handover]]:
    with backend.lock:
        modelled = backend.model_of(spec)
        released: int
        if asked.keep_as and asked.token is not None:
            released = modelled.keep(
                caller_of(spec), asked.holder, now_us(), token=asked.token,
                kept_as=asked.keep_as, info=asked.keep_info,
            )  # fmt: skip
        else:
            released = modelled.release(
                caller_of(spec), asked.holder, now_us(), asked.token, unused=asked.unused
            )
        return released, backend.told(spec, modelled)


def renew(
    backend: Backend, spec: SemaphoreSpec, asked: Renew
) -> tuple[float, set[str], list[Handover], int]:
    with backend.lock:
        modelled = backend.model_of(spec)
        held = [(holder, token) for holder, token, _ in asked.held]
        expires_ms, lost = modelled.renew(held, asked.lease_ms, now_us(), dispatch=spec.dispatch)
        return expires_ms / 1000, set(lost), backend.told(spec, modelled), 0


def configure(
    backend: Backend, spec: SemaphoreSpec, asked: Configure
) -> tuple[str | None, list[Handover]]:
    caller = caller_of(spec)
    with backend.lock:
        modelled, now = backend.model_of(spec), now_us()
        previous: str | None
        if asked.field == "override":
            old = modelled.set_override(int(asked.value) if asked.value else None, now, caller)
            previous = None if old is None else str(old)
        elif asked.field == "draining":
            previous = "1" if modelled.set_draining(asked.value == "1", now, caller) else None
        elif asked.field == "rate_override":
            rate = RateLimit.decode(asked.value) if asked.value else None
            old_rate = modelled.set_rate_override(model_rate(rate), now, caller)
            previous = None if old_rate is None else f"{old_rate.interval_us}|{old_rate.burst}"
        elif asked.field == "rate_pause":
            modelled.pause_rate(caller, int(asked.value), now)
            previous = None
        else:
            raise ValueError(f"unknown setting {asked.field!r}")
        return previous, backend.told(spec, modelled)


def status(backend: Backend, spec: SemaphoreSpec) -> SemaphoreStatus:
    with backend.lock:
        modelled = backend.model_of(spec)
        return semaphore_status(spec.name, modelled.status(caller_of(spec), now_us()))


#: The stores of this process, by URL.
BACKENDS: dict[str, Backend] = {}
_MADE = threading.Lock()


def _forget_all_in_child() -> None:
    """A forked child starts with no memory store: nothing crosses processes (and a
    lock held by another thread of the parent would hang it)."""
    global _MADE  # noqa: PLW0603 (a new lock for the child)
    BACKENDS.clear()
    _MADE = threading.Lock()


os.register_at_fork(after_in_child=_forget_all_in_child)


def backend_for(url: str) -> Backend:
    with _MADE:
        if url not in BACKENDS:
            BACKENDS[url] = Backend()
        return BACKENDS[url]


def acquire_all(
    backend: Backend, specs: Sequence[SemaphoreSpec], asked: AcquireAll
) -> tuple[list[Grant] | Places, list[list[Handover]]]:
    """A permit of every semaphore of ``specs``, or their places (`model.joint`)."""
    with backend.lock:
        models, now = [backend.model_of(spec) for spec in specs], now_us()
        parts = [
            Part(modelled, caller_of(spec), lease_ms, wait_ms, ask)
            for modelled, spec, lease_ms, wait_ms, ask in zip(
                models, specs, asked.lease_ms, asked.wait_ms, asked.asks, strict=True
            )
        ]
        reply = model_acquire_all(
            parts, asked.holder, now, hold_back_ms=asked.hold_ms, ticket=asked.ticket,
            info=asked.info, handover=asked.came_by,
        )  # fmt: skip
        if isinstance(reply, model.StaleCopy):
            raise StaleHandover(specs[reply.index].name, reply.token)
        handovers = [
            backend.told(spec, modelled) for spec, modelled in zip(specs, models, strict=True)
        ]
        if isinstance(reply, model.RefusedAll):
            places = tuple(
                place_of(refused, now // 1000, hold_ms=m.hold_ms or 0)
                for refused, m in zip(reply.places, models, strict=True)
            )
            return Places(reply.ticket, places, reply.refused_by), handovers
        return [grant_of(granted) for granted in reply], handovers


def wake_up_in(
    messages: Sequence[tuple[int, model.Published]], ticket: int, holder: str
) -> tuple[bool, Grant | None]:
    """Whether ``messages`` wake a waiter with ``ticket`` (a permit granted to ``holder``
    in place: that Grant; or tickets up to its own now admissible), as a Redis waiter
    reads its channel (`celery_semaphore.core.redis.wake_messages`)."""
    for _, message in messages:
        if isinstance(message, model.GrantedInPlace):
            if message.holder == holder:
                return True, Grant(
                    message.token, message.expires_ms / 1000, message.waited_ms / 1000
                )
        elif isinstance(message, model.Recall):
            continue
        elif message.ticket is None or not ticket or ticket <= message.ticket:
            return True, None
    return False, None
