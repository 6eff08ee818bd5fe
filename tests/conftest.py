"""Fixtures that run real, throwaway Redis servers and PostgreSQL clusters (see
devkit/redis_servers.py and devkit/postgres_servers.py).

Each fixture starts its own processes on free loopback ports and stops them at
teardown, whatever the outcome of the test. The shared Redis on 6379 and PostgreSQL
on 5432 are never used.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from async_as_sync import BlockingSemaphore, EventLoopThread
from celery_harness import Cluster, forget_closed_pools
from cluster_tools import rabbitmqctl

from celery_semaphore.core.redis import epochs
from celery_semaphore.state import installed_apps
from devkit.redis_servers import (
    AclRedisServer,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    TlsNotSupportedError,
    TlsRedisServer,
    UnixSocketRedisServer,
)

if TYPE_CHECKING:
    from devkit.postgres_servers import PostgresServer


@pytest.fixture(autouse=True)
def _no_closed_kombu_pool_outlives_its_test() -> Iterator[None]:
    """A test that closes an app's broker pool (``app.close()``) leaves it in kombu's
    process-wide registry, where a later test on the same port would get it."""
    yield
    forget_closed_pools()


@pytest.fixture(autouse=True)
def _no_test_app_takes_later_tests_places() -> Iterator[None]:
    """The publish handler asks every installed app that knows a task name, and Celery
    gives every app made later the tasks of ``limited_app`` (shared tasks): an app a
    test made and left for the garbage collector would take a later test's places at
    publish in the earlier test's Redis. Apps held by an imported module stay
    installed (``limited_app`` is imported once per session)."""
    before = set(installed_apps)
    yield
    in_modules = {id(getattr(m, "app", None)) for m in list(sys.modules.values())}
    for app in set(installed_apps) - before:
        if id(app) not in in_modules:
            installed_apps.discard(app)


@pytest.fixture(autouse=True)
def _each_test_starts_without_seen_data() -> None:
    """This process remembers the data epoch of every Redis it talked to; a later
    test's fresh server on a port used before, or the shared cluster emptied for
    it, would look like a data loss (a pause of the admissions)."""
    epochs.forget()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """Fresh, empty server for this test only; tests may kill or restart it."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_session_server() -> Iterator[RedisServer]:
    """Server shared by the whole session; tests must use unique keys and not stop it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of this test's fresh server (the same one as ``redis_server``)."""
    return redis_server.url


@pytest.fixture
def tls_redis() -> Iterator[TlsRedisServer]:
    """Fresh TLS-only server; skips only if redis-server was built without TLS."""
    server = TlsRedisServer()
    with contextlib.closing(server):
        try:
            server.start()
        except TlsNotSupportedError as exc:
            pytest.skip(str(exc))
        yield server


@pytest.fixture
def acl_redis() -> Iterator[AclRedisServer]:
    """Fresh server with ``requirepass`` and an ACL user; ``url`` logs in as that user."""
    with AclRedisServer() as server:
        yield server


@pytest.fixture
def unix_redis() -> Iterator[UnixSocketRedisServer]:
    """Fresh server whose ``url`` is a ``unix://`` socket URL."""
    with UnixSocketRedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def _redis_cluster_servers() -> Iterator[RedisClusterServers]:
    """Starting a cluster takes about 2 s (Redis delays cluster_state:ok), so start it once."""
    with RedisClusterServers() as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(_redis_cluster_servers: RedisClusterServers) -> RedisClusterServers:
    """Three-master cluster shared by the session, emptied with FLUSHALL before each test."""
    _redis_cluster_servers.flushall()
    return _redis_cluster_servers


@pytest.fixture
def redis_sentinel() -> Iterator[RedisSentinelServers]:
    """Fresh master + replica + Sentinel; per test because ``failover()`` is one-way."""
    with RedisSentinelServers() as sentinel:
        yield sentinel


@pytest.fixture(scope="session")
def postgres_session_server() -> Iterator[PostgresServer]:
    """Cluster shared by the whole session; tests must use their own database or table
    names and not crash, restart or stop it."""
    from devkit.postgres_servers import PostgresServer  # psycopg only for tests that use it

    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    """Fresh cluster for this test only (initdb takes about a second); tests may crash,
    restart or stop it, or cut off its clients."""
    from devkit.postgres_servers import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture
def celery_cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Factory of a :class:`celery_harness.Cluster` on this test's own Redis; stops every worker."""
    made: list[Cluster] = []

    def make(**kwargs: Any) -> Cluster:
        cluster = Cluster(redis_server.url, tmp_path, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


@pytest.fixture(params=["sync", "asyncio", "sync-evalsha"])
def make_semaphore(
    request: pytest.FixtureRequest, redis_session_server: RedisServer
) -> Iterator[Callable[..., Any]]:
    """Factory of semaphores on the session server (a fresh name unless named), run
    three times: :class:`Semaphore`, then :class:`AsyncSemaphore` behind the same
    blocking calls (``async_as_sync.py``), so one test body covers both APIs; then
    :class:`Semaphore` calling the scripts (EVALSHA) where the others call the Redis
    Functions library, so it covers both ways of calling. Closed at teardown."""
    from celery_semaphore import Semaphore
    from celery_semaphore.core.redis import functions, scripts

    made: list[Any] = []
    loop = EventLoopThread() if request.param == "asyncio" else None

    def make(limit: int = 1, *, name: str | None = None, url: str | None = None, **kw: Any):
        args = (url or redis_session_server.url, name or f"t-{uuid.uuid4().hex}", limit)
        sem = Semaphore(*args, **kw) if loop is None else BlockingSemaphore(loop, *args, **kw)
        if request.param == "sync-evalsha":
            scripts.library_of(sem.client).way = functions.SCRIPTS
        made.append(sem)
        return sem

    yield make
    for sem in made:
        sem.close()
    if loop is not None:
        loop.close()


@pytest.fixture(scope="module")
def rabbitmq_vhost() -> Iterator[str]:
    """A private vhost of the machine's RabbitMQ (amqp://guest:guest@127.0.0.1:5672),
    or ``/`` when rabbitmqctl can't make one (then names are unique)."""
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError:
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    vhost = f"celery-semaphore-test-{uuid.uuid4().hex[:8]}"
    if not (
        rabbitmqctl("add_vhost", vhost)
        and rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    ):
        rabbitmqctl("delete_vhost", vhost)
        yield ""
        return
    yield vhost
    rabbitmqctl("delete_vhost", vhost)
