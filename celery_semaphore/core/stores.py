"""Which store a semaphore's first argument names: ``memory://...`` the memory store
(`celery_semaphore.core.memory`), ``postgresql://...`` the PostgreSQL store
(`celery_semaphore.core.postgres`), a store made already, else Redis (a URL or a
redis-py client: `celery_semaphore.core.redis`)."""

from __future__ import annotations

from typing import Any, TypeVar

from celery_semaphore.core._async.store import AsyncStore
from celery_semaphore.core._sync.store import Store
from celery_semaphore.core.memory._async.store import AsyncMemoryStore
from celery_semaphore.core.memory._sync.store import MemoryStore
from celery_semaphore.core.postgres._async.store import AsyncPostgresStore
from celery_semaphore.core.postgres._sync.store import PostgresStore
from celery_semaphore.core.postgres.connection import is_postgres_url
from celery_semaphore.core.redis._async.store import AsyncRedisStore
from celery_semaphore.core.redis._sync.store import RedisStore

MEMORY = "memory://"
T = TypeVar("T")
STORES = (
    AsyncMemoryStore,
    MemoryStore,
    AsyncRedisStore,
    RedisStore,
    AsyncPostgresStore,
    PostgresStore,
)


def is_store(where: Any) -> bool:
    return isinstance(where, STORES)


def _given(where: T, url: str) -> T:
    """``where`` (a store, or a memory:// URL), which says its own URL: ``url`` is for
    a redis-py client passed in."""
    if url:
        raise TypeError(
            f"url= is only for a redis-py client passed in (the URL it was made from); "
            f"{where!r} says its own, got url={url!r}"
        )
    return where


def async_store(where: Any, url: str = "") -> AsyncStore:
    """The asyncio store ``where`` names (see the module docstring); ``url``: what a
    client passed in was made from."""
    if isinstance(where, (AsyncMemoryStore, AsyncRedisStore, AsyncPostgresStore)):
        return _given(where, url)
    if isinstance(where, str) and where.startswith(MEMORY):
        return AsyncMemoryStore(_given(where, url))
    if is_postgres_url(where):
        return AsyncPostgresStore(_given(where, url))
    return AsyncRedisStore(where, url)


def sync_store(where: Any, url: str = "") -> Store:
    """The synchronous store ``where`` names (see the module docstring)."""
    if isinstance(where, (MemoryStore, RedisStore, PostgresStore)):
        return _given(where, url)
    if isinstance(where, str) and where.startswith(MEMORY):
        return MemoryStore(_given(where, url))
    if is_postgres_url(where):
        return PostgresStore(_given(where, url))
    return RedisStore(where, url)
