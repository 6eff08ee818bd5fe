"""Where tasks may park, asked of real servers (no workers): a Redis with and without
``appendonly``, a user CONFIG is denied to, a Redis that refuses CONFIG (read through
INFO, its eviction policy too), every primary of a Cluster, the broker's own server on
a unix socket. The rules with fake answers: tests/unit/test_durability.py;
with real workers: test_redis_data_loss.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from redis.cluster import RedisCluster

from celery_semaphore.config import SemaphoreConfig
from celery_semaphore.core.operations import operated_store
from celery_semaphore.core.redis.connection import connect
from celery_semaphore.core.redis.server import eviction_policy, read_persistence
from celery_semaphore.durability import ParkingSafety, Where
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


@pytest.mark.parametrize(
    ("denied", "every_write"), [(["-config"], False), (["-config", "-info"], None)]
)
def test_a_user_denied_config_is_read_through_info_and_denied_both_is_unknown(
    acl_redis: AclRedisServer, denied: list[str], every_write: bool | None
) -> None:
    user = "no" + "".join(d.strip("-") for d in denied)
    with acl_redis.client() as admin:
        admin.acl_setuser(
            user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", *denied],
        )  # fmt: skip
    client = connect(f"redis://{user}:pw@{acl_redis.host}:{acl_redis.port}/0")[0]
    try:
        persistence = read_persistence(client)
    finally:
        client.close()
    assert persistence.every_write is every_write
    if every_write is None:
        assert "no permissions" in persistence.detail


NO_CONFIG = ("--rename-command", "CONFIG", "")  # as managed Redis services refuse it


@pytest.mark.parametrize("appendonly", ["yes", "no"])
@pytest.mark.parametrize(
    ("memory", "policy"),
    [
        (("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"), "allkeys-lru"),
        (("--maxmemory", "100mb", "--maxmemory-policy", "noeviction"), "noeviction"),
        (("--maxmemory-policy", "allkeys-lru"), None),  # no maxmemory: it never evicts
    ],
)
def test_a_redis_that_refuses_config_is_read_through_info(
    appendonly: str, memory: tuple[str, ...], policy: str | None
) -> None:
    with RedisServer(*NO_CONFIG, "--appendonly", appendonly, *memory) as server:
        store = operated_store(server.url)
        try:
            with server.client() as client, pytest.raises(redis.ResponseError):
                client.config_get("appendonly")  # so nothing below read it through CONFIG
            persistence = store.persistence()
            assert persistence.every_write is (appendonly == "yes")
            assert persistence.detail == (
                f"appendonly {appendonly} (read by INFO persistence: CONFIG GET refused)"
            )
            assert store.eviction_policy() == policy
        finally:
            store.close()


class ClusterRefusingConfig(RedisCluster):
    """A Cluster client whose servers refuse CONFIG (as a managed Cluster's may)."""

    def config_get(self, *args: Any, **kwargs: Any) -> Any:
        raise redis.ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'")


@pytest.mark.parametrize("refuses_config", [False, True])
def test_a_cluster_may_evict_if_any_primary_may(
    redis_cluster: RedisClusterServers, refuses_config: bool
) -> None:
    kind = ClusterRefusingConfig if refuses_config else RedisCluster
    client = kind(startup_nodes=redis_cluster.startup_nodes)
    last = redis_cluster.nodes[-1]
    try:
        assert eviction_policy(client) is None
        with last.client() as one:
            one.config_set("maxmemory-policy", "allkeys-lru")
            assert eviction_policy(client) is None  # no maxmemory: it never evicts
            one.config_set("maxmemory", "100mb")
        assert eviction_policy(client) == "allkeys-lru"
    finally:
        with last.client() as one:  # the cluster is the session's
            one.config_set("maxmemory", "0")
            one.config_set("maxmemory-policy", "noeviction")
        client.close()


def test_a_cluster_refusing_config_persists_every_write_only_if_every_primary_does(
    redis_cluster: RedisClusterServers,
) -> None:
    client = ClusterRefusingConfig(startup_nodes=redis_cluster.startup_nodes)
    nodes = redis_cluster.nodes
    try:
        assert read_persistence(client).every_write is False
        for node in nodes[:-1]:
            with node.client() as one:
                one.config_set("appendonly", "yes")
        assert read_persistence(client).every_write is False
        with nodes[-1].client() as one:
            one.config_set("appendonly", "yes")
        persistence = read_persistence(client)
        assert persistence.every_write is True
        assert "read by INFO persistence" in persistence.detail
    finally:
        for node in nodes:  # the cluster is the session's
            with node.client() as one:
                one.config_set("appendonly", "no")
        client.close()


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
        assert ParkingSafety().where(app, config, store) is Where.STORE
        # another Redis broker: the task parks in its parking queues, whatever this one keeps
        assert ParkingSafety().where(elsewhere, config, store) is Where.BROKER
    finally:
        store.close()
        elsewhere.close()
