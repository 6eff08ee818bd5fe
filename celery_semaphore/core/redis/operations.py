"""The Redis store's side for operators, workers and scrapes (synchronous): listing
semaphores, counts, what the server says of itself, the parked index, the watch
channel. (Losses of the data are told through
`celery_semaphore.core.losses`.) The sync `RedisStore` has these methods
(`celery_semaphore.core.operations.OperatedStore` says what they are); the Celery side,
the CLI and the metrics call them instead of reaching into Redis.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.results import Persistence, SemaphoreCounts

from . import discovery, parked_index, server
from .connection import SyncClient
from .keys import semaphore_keys, watch_channel


class AsyncRedisOperations:
    """The asyncio store has no operators' side: those callers are synchronous."""


class Watching:
    """A subscription to a namespace's watch channel: `heard()` says whether a message
    came since the last look (an operator's command, or a reconnection after the
    connection broke, when one may have been missed)."""

    def __init__(self, client: SyncClient, namespace: str) -> None:
        self._reconnected = False
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
        self._pubsub.subscribe(watch_channel(namespace))
        connection = getattr(self._pubsub, "connection", None)
        if connection is not None:
            connection.register_connect_callback(self._on_connect)

    def _on_connect(self, connection: Any) -> None:
        self._reconnected = True

    def heard(self) -> bool:
        """Whether a message came (or the connection came back); never blocks."""
        message = self._pubsub.get_message(timeout=0)  # may reconnect: read the flag after
        reconnected, self._reconnected = self._reconnected, False
        return message is not None or reconnected

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pubsub.close()


class ParkedIndex:
    """One reading of a namespace's parked index: the names listed (``entries``:
    name, listing time) at the server time ``now_ms``; `forget_idle()` takes off
    those whose parked waiters are gone (see `celery_semaphore.core.redis.parked_index`)."""

    def __init__(self, store: RedisOperations, namespace: str) -> None:
        self._store, self.namespace = store, namespace
        discovery.index_parked(store.client, namespace, store.url)
        self.now_ms, self.entries = parked_index.read(store.client, namespace, store.url)
        self.names = [name for name, _ in self.entries]

    def forget_idle(self) -> None:
        parked_index.forget_idle(
            self._store.client, self.namespace, self.now_ms, self.entries, self._store.url
        )


class RedisOperations:
    """The methods of `celery_semaphore.core.operations.OperatedStore` on Redis."""

    client: SyncClient
    url: str

    def semaphore_names(self, namespace: str, *, parked: bool = False) -> list[str]:
        """Every semaphore with state in the store, sorted; ``parked``: those with
        parked waiters (or their tombstones)."""
        role = "parked" if parked else "meta"
        return discovery.semaphore_names(self.client, namespace, self.url, role=role)

    def recorded_limit(
        self, namespace: str, name: str, *, override_only: bool = False
    ) -> int | None:
        """The limit the users of ``name`` declared (``override_only``: or the override
        set before its first use); None if neither."""
        return discovery.recorded_limit(
            self.client, namespace, name, self.url, override_only=override_only
        )

    def counts(
        self, namespace: str, names: Sequence[str], fields: Sequence[str] = ()
    ) -> list[SemaphoreCounts]:
        """The counts of each of ``names`` that exists, for a scrape: cheap, batched."""
        return discovery.read_counts(self.client, namespace, names, fields, self.url)

    def parked_counts(self, namespace: str, names: Sequence[str]) -> dict[str, int]:
        """How many tasks each of ``names`` keeps parked (not yet handed over)."""
        return discovery.parked_counts(self.client, namespace, names, self.url)

    def recorded_families(self, namespace: str, names: Sequence[str]) -> list[str | None]:
        """The family each of ``names`` belongs to, as its tasks recorded it."""
        return discovery.recorded_families(self.client, namespace, names, self.url)

    def recorded_rate(self, namespace: str, name: str) -> RateLimit | None:
        """The rate the tasks of ``name`` declare, as the last to ask recorded it."""
        meta = semaphore_keys(namespace, name).meta
        return discovery.recorded_rate(self.client, meta, self.url)

    def wake_workers(self, namespace: str, name: str) -> int:
        """Tell every worker's heartbeat to beat now for ``name``; how many heard it."""
        return discovery.wake_workers(self.client, namespace, name, self.url)

    def watch(self, namespace: str) -> Watching:
        """Listen for operators' commands to the workers of ``namespace``."""
        return Watching(self.client, namespace)

    def last_data_loss(self, namespace: str) -> tuple[float, float, float]:
        """When a client last noticed a loss of the store's data (0: never), the
        longest pause that followed, and how many permits were written back."""
        return discovery.last_data_loss(self.client, namespace, self.url)

    def parked_index(self, namespace: str) -> ParkedIndex:
        """The semaphores of ``namespace`` with parked waiters, as listed now."""
        return ParkedIndex(self, namespace)

    def ping(self) -> None:
        """`SemaphoreConnectionError` if the store does not answer."""
        server.ping(self.client, self.url)

    def eviction_policy(self) -> str | None:
        """The policy under which the store may evict keys (None: it does not, or it
        will not say)."""
        return server.eviction_policy(self.client)

    def persistence(self) -> Persistence:
        """Whether the store keeps every write across a restart (its AOF)."""
        return server.read_persistence(self.client, self.url)
