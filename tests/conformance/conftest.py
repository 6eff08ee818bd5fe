"""The stores the conformance suite runs against, and a fixture that makes pairs.

``store`` is parametrised over every store this repository ships: Redis calling the
Functions library (FCALL) and Redis calling the scripts (EVALSHA), on one server for
the session (each semaphore has a fresh name). A new store (PostgreSQL) adds a
parameter here that builds its own `Store`; the tests do not change.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conformance_driver import Pair, Store

from celery_semaphore import Semaphore
from celery_semaphore.core import functions, scripts
from devkit.redis_servers import RedisServer


class RedisStore:
    """Semaphores on one Redis server, called one ``way`` (functions.FUNCTIONS or
    functions.SCRIPTS); its clock is the server's TIME, which the scripts read."""

    def __init__(self, url: str, way: str) -> None:
        self.name = f"redis-{way}"
        self.url, self.way = url, way
        self.client = redis.Redis.from_url(url)
        self.made: list[Semaphore] = []

    def semaphore(self, limit: int | None, **options: Any) -> Semaphore:
        name = options.pop("name", None) or f"conformance-{uuid.uuid4().hex}"
        sem = Semaphore(self.url, name, limit, **options)
        library = scripts.library_of(sem.client)
        if self.way == functions.SCRIPTS:
            library.way = functions.SCRIPTS
        elif library.choose() != functions.FUNCTIONS:
            pytest.fail(f"this Redis refused the Functions library: {self.url}")
        self.made.append(sem)
        return sem

    def now_us(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    def close(self) -> None:
        for sem in self.made:
            sem.client.delete(*sem.keys.script_keys)
            sem.close()
        self.made.clear()
        self.client.close()


@pytest.fixture(params=[functions.FUNCTIONS, functions.SCRIPTS], ids=["functions", "evalsha"])
def store_factory(
    request: pytest.FixtureRequest, redis_session_server: RedisServer
) -> Iterator[Callable[[], Store]]:
    """Makes a `Store` (closed at teardown); a state machine makes one per example."""
    made: list[RedisStore] = []

    def make() -> Store:
        store = RedisStore(redis_session_server.url, request.param)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(store_factory: Callable[[], Store]) -> Store:
    return store_factory()


@pytest.fixture
def pair(store: Store) -> Callable[..., Pair]:
    """``pair(limit, **options)``: a store's semaphore and its model, driven together."""

    def make(limit: int | None = 1, **options: Any) -> Pair:
        return Pair(store, limit, **options)

    return make
