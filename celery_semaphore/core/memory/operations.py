"""The memory store's side for the Celery side, the CLI and the metrics (synchronous;
`celery_semaphore.core.operations.OperatedStore`): the same questions as of Redis,
answered from this process's models. With ``semaphore_redis_url = "memory://"`` an
app's tests run with no server: a worker in a thread of the test process (Celery's
``celery_worker`` fixture, ``start_worker``) or eager tasks share the semaphores.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from celery_semaphore.core.model import Caller
from celery_semaphore.core.model.parking import State
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.readings import counts_of, rate_limit, semaphore_status
from celery_semaphore.core.results import Persistence, SemaphoreCounts

from . import backend


class AsyncMemoryOperations:
    """The asyncio store has no operators' side: those callers are synchronous."""


class Watching:
    """A subscription to a namespace's operators' commands (`wake_workers`)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.flag = threading.Event()

    def heard(self) -> bool:
        heard = self.flag.is_set()
        self.flag.clear()
        return heard

    def close(self) -> None:
        self.flag.clear()


class ParkedIndex:
    """The semaphores of a namespace that have parked waiters, now."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def forget_idle(self) -> None:
        """Nothing to forget: the list is read from the models each time."""


#: A caller that declares nothing (the CLI's and the metrics' reads).
NO_DECLARATION = Caller(limit=0)


class MemoryOperations:
    """The methods of `celery_semaphore.core.operations.OperatedStore` on the memory
    store (its `backend.Backend`)."""

    _backend: backend.Backend
    url: str

    def semaphore_names(self, namespace: str, *, parked: bool = False) -> list[str]:
        with self._backend.lock:
            return sorted(
                name
                for (space, name), modelled in self._backend.models.items()
                if space == namespace and (not parked or modelled.parking.records)
            )

    def recorded_limit(
        self, namespace: str, name: str, *, override_only: bool = False
    ) -> int | None:
        with self._backend.lock:
            modelled = self._backend.models.get((namespace, name))
            if modelled is None:
                return None
            if modelled.recorded_limit is not None or not override_only:
                return modelled.recorded_limit
            return modelled.override

    def counts(
        self, namespace: str, names: Sequence[str], fields: Sequence[str] = ()
    ) -> list[SemaphoreCounts]:
        found = []
        with self._backend.lock:
            for name in names:
                modelled = self._backend.models.get((namespace, name))
                if modelled is None or modelled.recorded_limit is None:
                    continue
                read = semaphore_status(name, modelled.status(NO_DECLARATION, backend.now_us()))
                kept = {
                    "family": self._backend.families.get((namespace, name), ""),
                    "m_shadow_limit": str(modelled.shadow_limit_refusals),
                    "m_shadow_rate": str(modelled.shadow_rate_refusals),
                    "m_shadow_wait_ms": str(modelled.shadow_wait_ms),
                    "m_shadow_peak": str(modelled.shadow_peak),
                    **{field: str(n) for field, n in modelled.counters.items()},
                }
                found.append(counts_of(read, {f: kept.get(f, "") for f in fields}))
        return found

    def parked_counts(self, namespace: str, names: Sequence[str]) -> dict[str, int]:
        with self._backend.lock:
            return {
                name: modelled.parking.count(State.PARKED)
                for name in names
                if (modelled := self._backend.models.get((namespace, name))) is not None
            }

    def recorded_families(self, namespace: str, names: Sequence[str]) -> list[str | None]:
        with self._backend.lock:
            return [self._backend.families.get((namespace, name)) or None for name in names]

    def recorded_rate(self, namespace: str, name: str) -> RateLimit | None:
        with self._backend.lock:
            modelled = self._backend.models.get((namespace, name))
            return None if modelled is None else rate_limit(modelled.recorded_rate)

    def wake_workers(self, namespace: str, name: str) -> int:
        with self._backend.lock:
            watching = [w for w in self._backend.watching if w.namespace == namespace]
        for watch in watching:
            watch.flag.set()
        return len(watching)

    def watch(self, namespace: str) -> Watching:
        watching = Watching(namespace)
        with self._backend.lock:
            self._backend.watching.add(watching)
        return watching

    def last_data_loss(self, namespace: str) -> tuple[float, float, float]:
        """A memory store never loses its data while the process lives."""
        return 0.0, 0.0, 0.0

    def parked_index(self, namespace: str) -> ParkedIndex:
        return ParkedIndex(self.semaphore_names(namespace, parked=True))

    def ping(self) -> None:
        """It is in this process: it always answers."""

    def eviction_policy(self) -> str | None:
        return None

    def persistence(self) -> Persistence:
        """Tasks may park here: the memory store lives as long as the process that runs
        the tasks (a test's), which is all a message in a memory:// broker has too."""
        return Persistence(True, "memory:// (this process only, for tests)")
