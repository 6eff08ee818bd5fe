"""Turning a URL or a ready client into a redis-py client, and Redis errors into ours.

URL forms (query-string options such as ``ssl_ca_certs`` pass through to redis-py):

- ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS), ``unix:///path.sock?db=0``
- ``redis+cluster://host:port`` (or ``rediss+cluster://``): Redis Cluster, any node
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`` (or
  ``rediss+sentinel://``): the master Sentinel names for ``service``
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_semaphore.core.errors import SemaphoreBackendError, SemaphoreConnectionError
from celery_semaphore.core.urls import mask_url

from .packing import packs_faster

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

_SCHEMES = ("redis", "rediss", "unix")
_SCRIPT_DENIED = "user executing the script can't"


def _split(url: str) -> tuple[str, str, bool]:
    scheme, _, rest = url.partition("://")
    base, _, kind = scheme.partition("+")
    if not rest or base not in _SCHEMES or kind not in ("", "cluster", "sentinel"):
        raise ValueError(
            f"redis URL {mask_url(url)!r} is not understood: use redis://, rediss://, unix://, "
            "redis+cluster:// or redis+sentinel://host:port/service"
        )
    return base, kind, base == "rediss"


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    addresses = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":")
        addresses.append((host or item, int(port) if host else 26379))
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(
            f"redis URL {mask_url(url)!r} names no Sentinel service: "
            "use redis+sentinel://host:port/<service name>[/db]"
        )
    # redis-py's own parser: unquoted credentials, typed query options (socket_timeout=...).
    db = f"/{path[1]}" if len(path) > 1 else ""
    credentials = f"{userinfo}@" if userinfo else ""
    options: dict[str, Any] = redis.connection.parse_url(  # type: ignore[no-untyped-call]
        f"redis://{credentials}sentinel{db}?{parts.query}"
    )
    del options["host"]
    return addresses, path[0], options


class _SentinelMaster(redis.Redis):
    """The master client of a Sentinel URL: closing it also closes its Sentinel clients."""

    def close(self) -> None:
        super().close()
        pool = cast(redis.sentinel.SentinelConnectionPool, self.connection_pool)
        for sentinel in pool.sentinel_manager.sentinels:
            sentinel.close()


class _AsyncSentinelMaster(redis.asyncio.Redis):
    """Like `_SentinelMaster`, for ``redis.asyncio``."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool = cast(redis.asyncio.sentinel.SentinelConnectionPool, self.connection_pool)
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()


def is_cluster(client: SyncClient | AsyncClient) -> bool:
    return isinstance(client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster)


def connect(target: Any, url: str = "") -> tuple[SyncClient, str]:
    """A sync client for ``target`` (URL or client) and a masked description of it:
    for a client, ``url`` (the URL it was made from) if given, else `describe()`'s."""
    if isinstance(target, redis.Redis | redis.cluster.RedisCluster):
        return target, _shown(target, url)
    if not isinstance(target, str):
        raise TypeError(
            "redis must be a URL string or a redis.Redis / RedisCluster client, "
            f"got {type(target).__name__}"
        )
    _no_second_url(url)
    base, kind, tls = _split(target)
    plain = target.replace(f"{base}+{kind}://", f"{base}://", 1)
    if kind == "cluster":
        return redis.cluster.RedisCluster.from_url(plain), mask_url(target)
    if kind == "sentinel":
        addresses, service, options = _sentinel_parts(target)
        sentinel = redis.sentinel.Sentinel(addresses, ssl=tls, **options)  # type: ignore[no-untyped-call]
        master = sentinel.master_for(service, redis_class=_SentinelMaster)  # type: ignore[no-untyped-call]
        packs_faster(master.connection_pool)
        return master, mask_url(target)
    client = redis.Redis.from_url(target)
    packs_faster(client.connection_pool)
    return client, mask_url(target)


def connect_quick(url: str, timeout: float) -> SyncClient:
    """A client of a single Redis (``redis://``, ``rediss://``, ``unix://``) that gives
    up after ``timeout`` s and never retries: for callers that must never stall
    (publishing). Other URLs (Cluster, Sentinel) get the ordinary client."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )  # fmt: skip
    return connect(url)[0]


def connect_async(target: Any, url: str = "") -> tuple[AsyncClient, str]:
    """Like `connect()`, for ``redis.asyncio``."""
    if isinstance(target, redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster):
        return target, _shown(target, url)
    if not isinstance(target, str):
        raise TypeError(
            "redis must be a URL string or a redis.asyncio.Redis / RedisCluster client, "
            f"got {type(target).__name__}"
        )
    _no_second_url(url)
    base, kind, tls = _split(target)
    plain = target.replace(f"{base}+{kind}://", f"{base}://", 1)
    if kind == "cluster":
        return redis.asyncio.cluster.RedisCluster.from_url(plain), mask_url(target)
    if kind == "sentinel":
        addresses, service, options = _sentinel_parts(target)
        sentinel = redis.asyncio.sentinel.Sentinel(addresses, ssl=tls, **options)  # type: ignore[no-untyped-call]
        return sentinel.master_for(service, redis_class=_AsyncSentinelMaster), mask_url(target)
    return redis.asyncio.Redis.from_url(target), mask_url(target)


def _shown(client: Any, url: str) -> str:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    return mask_url(url) if url else describe(client)


def _no_second_url(url: str) -> None:
    if url:
        raise TypeError("url= names the URL a client passed as redis was made from; got a URL")


def describe(client: Any) -> str:
    """A URL-like, password-free description of a client, for error messages."""
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", None) or {}
    service = getattr(pool, "service_name", None)
    if service:
        sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", [])
        addresses = (s.connection_pool.connection_kwargs for s in sentinels)
        hosts = ",".join(f"{a.get('host')}:{a.get('port', 26379)}" for a in addresses)
        return f"redis+sentinel://{hosts or '...'}/{service}"
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    if "host" in kwargs:
        scheme = (
            "rediss" if "ssl" in str(getattr(pool, "connection_class", "")).lower() else "redis"
        )
        user = f"{kwargs['username']}:***@" if kwargs.get("username") else ""
        return f"{scheme}://{user}{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    nodes = getattr(client, "nodes_manager", None)
    if nodes is not None:
        return f"redis+cluster://{next(iter(getattr(nodes, 'startup_nodes', ())), '...')}"
    return type(client).__name__


def translate(error: redis.RedisError, url: str) -> Exception:
    """The package error for a redis-py error (WRONGTYPE is handled by the caller)."""
    if isinstance(error, redis.ConnectionError | redis.TimeoutError):
        return SemaphoreConnectionError(url, error)
    # Redis < 7.2 reports an ACL denial inside a script as a plain ERR, not NOPERM.
    if isinstance(error, redis.exceptions.NoPermissionError) or _SCRIPT_DENIED in str(error):
        return SemaphoreBackendError(
            f"Redis at {url} denied a command: {error} (grant the ACL user +@scripting "
            "+@sortedset +@hash +pexpire +time +publish +subscribe on the semaphore keys "
            "and channels)"
        )
    return SemaphoreBackendError(f"Redis at {url} answered with an error: {error}")
