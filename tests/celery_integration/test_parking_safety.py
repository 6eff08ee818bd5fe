"""Where tasks may park, asked of real servers (no workers): a Redis with and without
``appendonly``, a user CONFIG is denied to, every primary of a Cluster, the broker's
own server on a unix socket. The rules with fake answers: tests/unit/test_durability.py;
with real workers: test_redis_data_loss.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_semaphore.config import SemaphoreConfig
from celery_semaphore.core.operations import operated_store
from celery_semaphore.core.redis.connection import connect
from celery_semaphore.core.redis.server import read_persistence
from celery_semaphore.durability import ParkingSafety
from devkit.redis_servers import (
    AclRedisServer,
    RedisClusterServers,
    RedisServer,
    UnixSocketRedisServer,
)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("parking_safety", broker="memory://", set_as_current=False)
    yield app
    app.close()


def test_appendonly_is_read_from_the_server(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)[0]
    try:
        assert read_persistence(client).every_write is False
        client.config_set("appendonly", "yes")
        assert read_persistence(client).every_write is True
    finally:
        client.close()


def test_a_user_denied_config_is_an_unknown_persistence(acl_redis: AclRedisServer) -> None:
    with acl_redis.client() as admin:
        admin.acl_setuser(
            "nocfg", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-config"],
        )  # fmt: skip
    client = connect(f"redis://nocfg:pw@{acl_redis.host}:{acl_redis.port}/0")[0]
    try:
        persistence = read_persistence(client)
    finally:
        client.close()
    assert persistence.every_write is None
    assert "no permissions" in persistence.detail


def test_a_cluster_persists_every_write_only_if_every_primary_does(
    redis_cluster: RedisClusterServers,
) -> None:
    client = connect(redis_cluster.url.replace("redis://", "redis+cluster://"))[0]
    nodes = redis_cluster.nodes
    try:
        assert read_persistence(client).every_write is False
        for node in nodes[:-1]:
            with node.client() as one:
                one.config_set("appendonly", "yes")
        assert read_persistence(client).every_write is False
        with nodes[-1].client() as one:
            one.config_set("appendonly", "yes")
        assert read_persistence(client).every_write is True
    finally:
        for node in nodes:  # the cluster is the session's
            with node.client() as one:
                one.config_set("appendonly", "no")
        client.close()


def test_the_brokers_unix_socket_server_takes_parked_tasks_without_asking(
    app: Celery, unix_redis: UnixSocketRedisServer
) -> None:
    app.conf.broker_url = unix_redis.url  # ?db=0
    semaphores = unix_redis.url.replace("?db=0", "?db=1")
    store = operated_store(semaphores)
    elsewhere = Celery("elsewhere", broker="redis://127.0.0.1:1/0", set_as_current=False)
    config = SemaphoreConfig(redis_url=semaphores)
    try:
        assert ParkingSafety().allows(app, config, store)
        assert not ParkingSafety().allows(elsewhere, config, store)  # it persists nothing
    finally:
        store.close()
        elsewhere.close()
