"""What the Celery side, the CLI and the metrics ask of a store beyond one semaphore's
operations: `OperatedStore`, a synchronous `Store` with an operators' side. The Redis
store has it (`celery_semaphore.core.redis.operations`), the PostgreSQL store
(`celery_semaphore.core.postgres.operations`), and the memory
store (`celery_semaphore.core.memory.operations`: an app's tests with no server, its
worker in a thread of the test process). `operated_store()` makes one from a URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from celery_semaphore.core._sync.semaphore import Semaphore
from celery_semaphore.core._sync.store import Store
from celery_semaphore.core.errors import SemaphoreConnectionError, UnknownSemaphore
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.results import Persistence, SemaphoreCounts
from celery_semaphore.core.urls import mask_url


class Watching(Protocol):
    """A subscription to the operators' commands for a namespace's workers."""

    def heard(self) -> bool:
        """Whether a command came since the last look (or one may have been missed);
        never blocks."""
        ...

    def close(self) -> None: ...


class ParkedIndex(Protocol):
    """One reading of the semaphores that have parked waiters in a namespace."""

    names: list[str]

    def forget_idle(self) -> None:
        """Stop listing those of ``names`` whose parked waiters are gone for a while."""
        ...


class OperatedStore(Store, Protocol):
    """A store with an operators' side (see the module docstring)."""

    def semaphore_names(self, namespace: str, *, parked: bool = False) -> list[str]:
        """Every semaphore with state in the store, sorted; ``parked``: those with
        parked waiters."""
        ...

    def recorded_limit(
        self, namespace: str, name: str, *, override_only: bool = False
    ) -> int | None:
        """The limit the users of ``name`` declared (``override_only``: or the override
        set before its first use); None if neither."""
        ...

    def counts(
        self, namespace: str, names: Sequence[str], fields: Sequence[str] = ()
    ) -> list[SemaphoreCounts]:
        """The counts of each of ``names`` that exists, for a scrape."""
        ...

    def parked_counts(self, namespace: str, names: Sequence[str]) -> dict[str, int]:
        """How many tasks each of ``names`` keeps parked (not yet handed over)."""
        ...

    def recorded_families(self, namespace: str, names: Sequence[str]) -> list[str | None]:
        """The family each of ``names`` belongs to, as its tasks recorded it."""
        ...

    def recorded_rate(self, namespace: str, name: str) -> RateLimit | None:
        """The rate the tasks of ``name`` declare, as the last to ask recorded it."""
        ...

    def wake_workers(self, namespace: str, name: str) -> int:
        """Tell every worker's heartbeat to beat now for ``name``; how many heard."""
        ...

    def watch(self, namespace: str) -> Watching:
        """Listen for operators' commands to the workers of ``namespace``."""
        ...

    def last_data_loss(self, namespace: str) -> tuple[float, float, float]:
        """When a loss of the store's data was last noticed (0: never), the longest
        pause after it, the permits written back."""
        ...

    def parked_index(self, namespace: str) -> ParkedIndex:
        """The semaphores of ``namespace`` with parked waiters, as listed now."""
        ...

    def ping(self) -> None:
        """`SemaphoreConnectionError` if the store does not answer."""
        ...

    def eviction_policy(self) -> str | None:
        """The policy under which the store may drop data (None: none, or unknown)."""
        ...

    def persistence(self) -> Persistence:
        """Whether the store keeps every write across a restart."""
        ...


def operated_store(
    where: Any, url: str = "", *, quick_timeout: float | None = None
) -> OperatedStore:
    """The store ``where`` names (a URL, a redis-py client, or an operated store), with
    its operators' side. A store made from a URL owns its client (`close()` closes it);
    ``url``: what a client passed in was made from. ``quick_timeout`` (with a Redis
    URL): a client that gives up within that many seconds, for callers that must never
    stall (publishing); a PostgreSQL store then asks no call twice, and connects as its
    URL says (libpq's ``connect_timeout``)."""
    from celery_semaphore.core.memory._sync.store import MemoryStore  # noqa: PLC0415
    from celery_semaphore.core.postgres._sync.store import RETRIES, PostgresStore  # noqa: PLC0415
    from celery_semaphore.core.postgres.connection import is_postgres_url  # noqa: PLC0415
    from celery_semaphore.core.postgres.operations import PostgresOperatedStore  # noqa: PLC0415
    from celery_semaphore.core.redis._sync.store import RedisStore  # noqa: PLC0415
    from celery_semaphore.core.redis.connection import connect_quick  # noqa: PLC0415
    from celery_semaphore.core.redis.server import UNREACHABLE  # noqa: PLC0415
    from celery_semaphore.core.stores import MEMORY  # noqa: PLC0415

    if isinstance(where, RedisStore | MemoryStore | PostgresOperatedStore):
        return where
    if isinstance(where, PostgresStore):
        raise TypeError(
            f"{where!r} has no operators' side: pass its URL, or a PostgresOperatedStore "
            "(celery_semaphore.core.postgres.operations)"
        )
    if isinstance(where, str) and where.startswith(MEMORY):
        return MemoryStore(where)
    if is_postgres_url(where):
        return PostgresOperatedStore(where, retries=0 if quick_timeout is not None else RETRIES)
    try:
        if isinstance(where, str) and quick_timeout is not None:
            return RedisStore(connect_quick(where, quick_timeout), where, owns_client=True)
        return RedisStore(where, url)
    except UNREACHABLE as error:  # a Cluster client asks the cluster as it is made
        raise SemaphoreConnectionError(mask_url(url or str(where)), error) from error


def open_semaphore(
    where: Any,
    namespace: str,
    name: str,
    url: str = "",
    *,
    override_only: bool = False,
    **kwargs: Any,
) -> Semaphore:
    """The existing semaphore ``name`` of the store ``where`` names (see
    `operated_store()`), with the limit its users declared; with ``override_only``,
    also one nobody used yet whose limit an operator set (``set-limit`` before its
    first use), opened with that override as its limit. `UnknownSemaphore` otherwise."""
    store = operated_store(where, url)
    try:
        limit = store.recorded_limit(namespace, name, override_only=override_only)
    finally:
        if isinstance(where, str):  # the semaphore makes its own store, and closes it
            store.close()
    if limit is None:
        raise UnknownSemaphore(name, namespace)
    if isinstance(where, str):
        return Semaphore(where, name, limit, namespace=namespace, **kwargs)
    return Semaphore(store, name, limit, namespace=namespace, **kwargs)
