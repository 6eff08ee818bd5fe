"""Which store a semaphore's first argument names: ``memory://...`` the memory store
(`celery_semaphore.core.memory`), a store made already, else Redis (a URL or a
redis-py client: `celery_semaphore.core.redis`)."""

from __future__ import annotations

from typing import Any

from celery_semaphore.core._async.store import AsyncStore
from celery_semaphore.core._sync.store import Store
from celery_semaphore.core.memory._async.store import AsyncMemoryStore
from celery_semaphore.core.memory._sync.store import MemoryStore
from celery_semaphore.core.redis._async.store import AsyncRedisStore
from celery_semaphore.core.redis._sync.store import RedisStore

MEMORY = "memory://"
STORES = (AsyncMemoryStore, MemoryStore, AsyncRedisStore, RedisStore)


def is_store(where: Any) -> bool:
    return isinstance(where, STORES)


def async_store(where: Any, url: str = "") -> AsyncStore:
    """The asyncio store ``where`` names (see the module docstring); ``url``: what a
    client passed in was made from."""
    if isinstance(where, (AsyncMemoryStore, AsyncRedisStore)):
        return where
    if isinstance(where, str) and where.startswith(MEMORY):
        return AsyncMemoryStore(where)
    return AsyncRedisStore(where, url)


def sync_store(where: Any, url: str = "") -> Store:
    """The synchronous store ``where`` names (see the module docstring)."""
    if isinstance(where, (MemoryStore, RedisStore)):
        return where
    if isinstance(where, str) and where.startswith(MEMORY):
        return MemoryStore(where)
    return RedisStore(where, url)
