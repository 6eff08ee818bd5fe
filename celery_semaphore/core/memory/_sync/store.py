# Generated from celery_semaphore/core/memory/_async/store.py by scripts/unasync.py:
# do not edit; edit the asyncio source and run the script.
"""`MemoryStore`: semaphores in this process's memory, as the reference model
states them (`celery_semaphore.core.memory`).

``core/memory/_async/store.py`` is the source; ``core/memory/_sync/store.py`` is
generated from it (``scripts/unasync.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery_semaphore.core import model
from celery_semaphore.core.constants import ANY_CHANNEL
from celery_semaphore.core.errors import SemaphoreConnectionError
from celery_semaphore.core.memory import backend
from celery_semaphore.core.memory.operations import MemoryOperations
from celery_semaphore.core.protocol import SemaphoreSpec
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

#: How often a waiter looks whether anything changed (s): there are no wake messages.
LOOK_EVERY = 0.005


@dataclass
class Listening:
    """A waiter's subscription: the semaphores it listens to, the last message seen."""

    keys: frozenset[tuple[str, str]]
    seen: int


class MemoryStore(MemoryOperations):
    """The semaphores of ``url`` (``memory://`` or ``memory://<name>``) in this process
    (`celery_semaphore.core._sync.store.Store`). The synchronous store also has an
    operators' side (`celery_semaphore.core.memory.operations`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._backend = backend.backend_for(url)

    def __repr__(self) -> str:
        return f"MemoryStore({self.url!r})"

    def acquire(
        self, spec: SemaphoreSpec, request: Acquire
    ) -> tuple[Grant | Place, list[Handover]]:
        return backend.acquire(self._backend, spec, request)

    def acquire_all(
        self, specs: Sequence[SemaphoreSpec], request: AcquireAll
    ) -> tuple[list[Grant] | Places, list[list[Handover]]]:
        return backend.acquire_all(self._backend, specs, request)

    def joint_problem(self, members: Sequence[tuple[Any, SemaphoreSpec]]) -> str | None:
        for store, spec in members[1:]:
            if store.url != self.url:
                first = members[0][1].name
                return (
                    f"semaphores must share one store (one memory:// URL): {first!r} is on "
                    f"{self.url}, {spec.name!r} on {store.url}"
                )
        specs = [spec for _, spec in members]
        names = [spec.name for spec in specs]
        if len(set(names)) < len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            return f"semaphores must have distinct names; given twice: {', '.join(twice)}"
        if len({spec.namespace for spec in specs}) > 1:
            return "semaphores must share one namespace to be taken in one step"
        return None

    def park(self, spec: SemaphoreSpec, request: Park) -> tuple[Parked, list[Handover]]:
        return backend.park(self._backend, spec, request)

    def claim(self, spec: SemaphoreSpec, request: Claim) -> Claimed:
        return backend.claim(self._backend, spec, request)

    def list_parked(self, spec: SemaphoreSpec) -> None:
        """Nothing to list: the models of this store are all there is."""

    def enqueue(self, spec: SemaphoreSpec, request: Enqueue) -> tuple[Place, bool, list[Handover]]:
        return backend.enqueue(self._backend, spec, request)

    def dispatch(self, spec: SemaphoreSpec, drop: tuple[str, ...]) -> list[Handover]:
        return backend.dispatch(self._backend, spec, drop)

    def release(self, spec: SemaphoreSpec, request: Release) -> tuple[int, list[Handover]]:
        return backend.release(self._backend, spec, request)

    def renew(
        self, spec: SemaphoreSpec, request: Renew
    ) -> tuple[float, set[str], list[Handover], int]:
        return backend.renew(self._backend, spec, request)

    def configure(
        self, spec: SemaphoreSpec, request: Configure
    ) -> tuple[str | None, list[Handover]]:
        return backend.configure(self._backend, spec, request)

    def status(self, spec: SemaphoreSpec) -> SemaphoreStatus:
        return backend.status(self._backend, spec)

    def learn_epoch(self, spec: SemaphoreSpec) -> None:
        """A memory store never loses its data while the process lives."""

    def note_lost(self, spec: SemaphoreSpec, count: int) -> None:
        """The memory store keeps no metrics counters."""

    def listen(self, specs: Sequence[SemaphoreSpec]) -> Any:
        keys = frozenset((spec.namespace, spec.name) for spec in specs)
        with self._backend.lock:
            return Listening(keys, self._backend.messages.last)

    def wait_for_wakeup(
        self, subscription: Any, ticket: int, holder: str, seconds: float
    ) -> Grant | None:
        """Until a message published since the waiter last looked wakes it (see
        `backend.wake_up_in`), or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while (messages := self._next_messages(subscription, deadline)) is not None:
            woken, grant = backend.wake_up_in(messages, ticket, holder)
            if woken:
                return grant
        return None

    def wait_for_message(self, subscription: Any, seconds: float) -> str | None:
        """`ANY_CHANNEL` (it does not say which) once a message comes."""
        messages = self._next_messages(subscription, time.monotonic() + seconds)
        return None if messages is None else ANY_CHANNEL

    def wake_channel(self, spec: SemaphoreSpec) -> str:
        return f"{spec.namespace}:{spec.name}"

    def _next_messages(
        self, subscription: Any, deadline: float
    ) -> list[tuple[int, model.Published]] | None:
        """The messages published since the subscriber last looked, once there are
        any (it looks every `LOOK_EVERY` s), or None at ``deadline``."""
        while True:
            with self._backend.lock:
                messages = self._backend.messages.since(subscription.seen, subscription.keys)
            if messages:
                subscription.seen = messages[-1][0]
                return messages
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(LOOK_EVERY, left))

    def unlisten(self, subscription: Any, *, keep: bool) -> None:
        """Nothing to close."""

    def reconnectable(self, error: SemaphoreConnectionError) -> bool:
        return False

    def close(self) -> None:
        """Nothing to close: the state stays with the process (another semaphore of the
        same URL sees it)."""
