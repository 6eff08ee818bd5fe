"""URL forms, password masking and the translation of redis-py errors.

Clients are only built here, never used: building a redis-py client from a URL
does not connect (the sync Redis Cluster client does, so only its asyncio twin
is built). The conftest refuses every socket connect, so a test that would
reach a server fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.connection

from celery_semaphore.core.errors import SemaphoreBackendError, SemaphoreConnectionError
from celery_semaphore.core.redis.connection import (
    connect,
    connect_async,
    describe,
    mask_url,
    translate,
)

# ------------------------------------------------------------------ masking


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:secret@db:6379/0", "redis://user:***@db:6379/0"),
        ("redis://:secret@db", "redis://:***@db"),
        ("rediss://default:s3cr3t@db:6380/1?ssl_cert_reqs=none",
         "rediss://default:***@db:6380/1?ssl_cert_reqs=none"),
        # redis-py splits user-info at the last '@' and the first ':'.
        ("redis://user:p@ss@db:1/0", "redis://user:***@db:1/0"),
        ("redis://:p:w@db", "redis://:***@db"),
        ("unix://user:secret@/run/redis.sock?db=1", "unix://user:***@/run/redis.sock?db=1"),
        ("unix:///run/redis.sock?db=3&password=secret", "unix:///run/redis.sock?db=3&password=***"),
        ("redis://db?PASSWORD=secret&db=1", "redis://db?PASSWORD=***&db=1"),
        ("redis+sentinel://u:secret@s1:26379,s2:26380/mymaster?sentinel_password=other",
         "redis+sentinel://u:***@s1:26379,s2:26380/mymaster?sentinel_password=***"),
        ("redis+cluster://:secret@node:7000", "redis+cluster://:***@node:7000"),
    ],
)  # fmt: skip
def test_passwords_are_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert "secret" not in mask_url(url) and "s3cr3t" not in mask_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://db:6379/0",
        "redis://user@db:6379",  # a user name alone is no secret
        "redis://db:6379/0?socket_timeout=2&client_name=a@b",
        "unix:///run/redis.sock",
        "redis+sentinel://s1,s2:26380/mymaster/2",
    ],
)
def test_urls_without_a_password_are_unchanged(url: str) -> None:
    assert mask_url(url) == url


# ------------------------------------------------------------- URL forms


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    """Sync clients to close at teardown (they never connected, so closing is local)."""
    made: list[Any] = []
    yield made
    for client in made:
        client.close()


def connected(made: list[Any], url: str) -> tuple[Any, str]:
    client, description = connect(url)
    made.append(client)
    return client, description


def test_plain_url(clients: list[Any]) -> None:
    client, description = connected(clients, "redis://user:secret@db:6390/2?socket_timeout=2.5")
    kwargs = client.connection_pool.connection_kwargs
    assert type(client) is redis.Redis
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("db", 6390, 2)
    assert (kwargs["username"], kwargs["password"]) == ("user", "secret")
    assert kwargs["socket_timeout"] == 2.5  # query options pass through to redis-py
    assert description == "redis://user:***@db:6390/2?socket_timeout=2.5"


def test_tls_url(clients: list[Any]) -> None:
    client, _ = connected(clients, "rediss://db:6380/0?ssl_cert_reqs=none")
    assert client.connection_pool.connection_class is redis.connection.SSLConnection
    assert describe(client) == "rediss://db:6380/0"


def test_unix_socket_url(clients: list[Any]) -> None:
    client, description = connected(clients, "unix:///run/redis.sock?db=3&password=secret")
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["path"], kwargs["db"], kwargs["password"]) == ("/run/redis.sock", 3, "secret")
    assert description == "unix:///run/redis.sock?db=3&password=***"
    assert describe(client) == "unix:///run/redis.sock"


def test_sentinel_url(clients: list[Any]) -> None:
    url = "redis+sentinel://user:p%40ss@s1:26380,s2/mymaster/4?socket_timeout=2"
    client, description = connected(clients, url)
    pool = client.connection_pool
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"]) for s in sentinels] == [("s1", 26380), ("s2", 26379)]
    assert pool.service_name == "mymaster"
    kwargs = pool.connection_kwargs
    # The credentials are the master's, unquoted; the query options are typed.
    assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("user", "p@ss", 4)
    assert kwargs["socket_timeout"] == 2.0
    assert description == "redis+sentinel://user:***@s1:26380,s2/mymaster/4?socket_timeout=2"
    assert describe(client) == "redis+sentinel://s1:26380,s2:26379/mymaster"


def test_tls_sentinel_url_talks_tls_to_the_master(clients: list[Any]) -> None:
    client, _ = connected(clients, "rediss+sentinel://s1/mymaster")
    assert "SSL" in client.connection_pool.connection_class.__name__


def test_sentinel_url_without_a_service_is_refused() -> None:
    with pytest.raises(ValueError, match=r"names no Sentinel service") as info:
        connect("redis+sentinel://:secret@s1:26379")
    assert "secret" not in str(info.value)
    assert "redis+sentinel://host:port/<service name>" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:secret@db:6379/0",
        "db:6379",
        "redis://",
        "redis+nonsense://db:6379",
        "redis+cluster+sentinel://db",
        "sentinel://db:26379/mymaster",  # kombu's spelling, not ours
        "",
    ],
)
def test_unknown_url_forms_are_refused_with_the_forms_that_work(url: str) -> None:
    with pytest.raises(ValueError, match=r"is not understood: use redis://, rediss://") as info:
        connect(url)
    assert "secret" not in str(info.value)
    with pytest.raises(ValueError, match=r"is not understood"):
        connect_async(url)


@pytest.mark.parametrize("target", [6379, None, b"redis://db"])
def test_sync_connect_wants_a_url_or_a_sync_client(target: Any) -> None:
    with pytest.raises(TypeError, match=r"^redis must be a URL string or a redis.Redis") as info:
        connect(target)
    assert str(info.value).endswith(f"got {type(target).__name__}")


def test_sync_connect_refuses_an_asyncio_client() -> None:
    client = redis.asyncio.Redis()
    with pytest.raises(TypeError, match=r"^redis must be a URL string or a redis.Redis"):
        connect(client)
    asyncio.run(client.aclose())


def test_async_connect_wants_a_url_or_an_async_client(clients: list[Any]) -> None:
    sync_client = redis.Redis()
    clients.append(sync_client)
    with pytest.raises(TypeError, match=r"^redis must be a URL string or a redis.asyncio.Redis"):
        connect_async(sync_client)


def test_a_ready_client_is_used_as_is(clients: list[Any]) -> None:
    client = redis.Redis(host="db", port=6400, db=5, username="app", password="secret")
    clients.append(client)
    same, description = connect(client)
    assert same is client
    assert description == "redis://app:***@db:6400/5"


def test_async_urls() -> None:
    async def main() -> list[tuple[str, str, str]]:
        seen = []
        for url in (
            "redis://:secret@db:1/0",
            "redis+cluster://:secret@node:7000",
            "redis+sentinel://s1:26379/mymaster",
        ):
            client, description = connect_async(url)
            seen.append((type(client).__name__, description, describe(client)))
            await client.aclose()
        return seen

    assert asyncio.run(main()) == [
        ("Redis", "redis://:***@db:1/0", "redis://db:1/0"),
        ("RedisCluster", "redis+cluster://:***@node:7000", "redis+cluster://node:7000"),
        ("_AsyncSentinelMaster", "redis+sentinel://s1:26379/mymaster",
         "redis+sentinel://s1:26379/mymaster"),
    ]  # fmt: skip


def test_describe_of_something_else_is_its_type_name() -> None:
    assert describe(object()) == "object"


# ----------------------------------------------------------- redis errors


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Error 111 connecting to db:6379. Connection refused."),
        redis.TimeoutError("Timeout reading from socket"),
    ],
)
def test_unreachable_redis_is_a_connection_error(error: redis.RedisError) -> None:
    translated = translate(error, "redis://db:6379/0")
    assert type(translated) is SemaphoreConnectionError
    assert str(translated).startswith(f"Redis at redis://db:6379/0 failed: {error}")
    assert "check that Redis runs there" in str(translated)


def test_refused_credentials_say_so() -> None:
    translated = translate(redis.AuthenticationError("invalid password"), "redis://db")
    assert type(translated) is SemaphoreConnectionError
    assert "put the right user/password in the URL" in str(translated)


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run 'evalsha'"),
        # Redis < 7.2 says it inside a script as a plain ERR.
        redis.ResponseError(
            "Error running script: @user_script:12: The user executing the script can't "
            "run this command or subcommand"
        ),
    ],
)
def test_acl_denial_names_the_rules_to_grant(error: redis.RedisError) -> None:
    translated = translate(error, "redis://app:***@db")
    assert type(translated) is SemaphoreBackendError
    assert str(translated).startswith("Redis at redis://app:***@db denied a command: ")
    assert "+@scripting +@sortedset +@hash +pexpire +time +publish +subscribe" in str(translated)


def test_other_redis_errors_are_backend_errors_with_the_url() -> None:
    translated = translate(redis.ResponseError("OOM command not allowed"), "redis://db")
    assert type(translated) is SemaphoreBackendError
    assert str(translated) == "Redis at redis://db answered with an error: OOM command not allowed"
