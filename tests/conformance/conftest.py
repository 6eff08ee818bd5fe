"""The stores the conformance suite runs against, and a fixture that makes pairs.

``store`` is parametrised over every store this repository ships: Redis calling the
Functions library (FCALL) and Redis calling the scripts (EVALSHA), on one server for
the session (each semaphore has a fresh name), and the memory store (``memory://``,
the model itself behind the public API: what it checks is the seam, the requests and
the replies' conversions). A new store (PostgreSQL) adds a parameter here that builds
its own `Store`; the tests do not change.

The PostgreSQL store runs on a cluster of the session's own (``postgres_session_server``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conformance_driver import Pair, Store

from celery_semaphore import Semaphore
from celery_semaphore.core.operations import OperatedStore, operated_store
from celery_semaphore.core.redis import functions, scripts


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

    def operated(self) -> OperatedStore:
        return operated_store(self.client, self.url)

    def close(self) -> None:
        for sem in self.made:
            sem.client.delete(*sem.keys.script_keys)
            sem.close()
        self.made.clear()
        self.client.close()


class MemoryStore:
    """Semaphores of the memory store (one ``memory://`` URL per store); its clock is
    this process's, which the memory store reads."""

    name = "memory"

    def __init__(self) -> None:
        self.url = f"memory://conformance-{uuid.uuid4().hex}"
        self.made: list[Semaphore] = []

    def semaphore(self, limit: int | None, **options: Any) -> Semaphore:
        name = options.pop("name", None) or f"conformance-{uuid.uuid4().hex}"
        sem = Semaphore(self.url, name, limit, **options)
        self.made.append(sem)
        return sem

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def operated(self) -> OperatedStore:
        return operated_store(self.url)

    def close(self) -> None:
        for sem in self.made:
            sem.close()
        self.made.clear()


class PostgresStore:
    """Semaphores in one PostgreSQL database; its clock is the database's
    clock_timestamp(), which the functions read."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self.connection = psycopg.connect(url, autocommit=True)
        self.made: list[Semaphore] = []
        self._operated: OperatedStore | None = None

    def semaphore(self, limit: int | None, **options: Any) -> Semaphore:
        name = options.pop("name", None) or f"conformance-{uuid.uuid4().hex}"
        sem = Semaphore(self.url, name, limit, **options)
        self.made.append(sem)
        return sem

    def now_us(self) -> int:
        row = self.connection.execute(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def operated(self) -> OperatedStore:
        if self._operated is None:
            self._operated = operated_store(self.url)
        return self._operated

    def close(self) -> None:
        for sem in self.made:
            sem.close()
        self.made.clear()
        self.connection.close()
        if self._operated is not None:
            self._operated.close()


@pytest.fixture(
    params=[functions.FUNCTIONS, functions.SCRIPTS, "memory", "postgres"],
    ids=["functions", "evalsha", "memory", "postgres"],
)
def store_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[], Store]]:
    """Makes a `Store` (closed at teardown); a state machine makes one per example."""
    made: list[RedisStore | MemoryStore | PostgresStore] = []

    def make() -> Store:
        store: RedisStore | MemoryStore | PostgresStore
        if request.param == "memory":
            store = MemoryStore()
        elif request.param == "postgres":
            store = PostgresStore(request.getfixturevalue("postgres_session_server").url)
        else:
            url = request.getfixturevalue("redis_session_server").url
            store = RedisStore(url, request.param)
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


@pytest.fixture
def listening(store: Store) -> Iterator[Callable[..., Pair]]:
    """``listening(limit, **options)``: a pair whose store's wake channel is heard."""
    made: list[Pair] = []

    def make(limit: int | None = 1, **options: Any) -> Pair:
        made.append(Pair(store, limit, listen=True, **options))
        return made[-1]

    yield make
    for p in made:
        p.close()
