"""What a Redis server says of itself: whether it answers, whether it persists every
write, whether it may evict keys. The Celery side asks these here (where tasks may
park: `celery_semaphore.durability`; the worker's checks at start:
`celery_semaphore.worker.bootstep`) instead of sending these commands itself.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from celery_semaphore.core.errors import SemaphoreConnectionError
from celery_semaphore.core.results import Persistence

from .connection import translate

#: Errors that say nothing about the Redis's settings: it cannot answer now.
UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)


def ping(client: Any, url: str = "") -> None:
    """Whether the Redis answers: `SemaphoreConnectionError` (or the package's error
    for what it answered) if not."""
    try:
        client.ping()
    except UNREACHABLE as error:  # a Cluster's own errors are no RedisError
        raise SemaphoreConnectionError(url or "redis", error) from error
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error


def eviction_policy(client: Any) -> str | None:
    """The ``maxmemory-policy`` of a Redis that has a ``maxmemory`` (it may evict keys
    when it reaches it); None when it has none, or when CONFIG is refused (a managed
    Redis): nothing is known then."""
    try:
        maxmemory = int(client.config_get("maxmemory").get("maxmemory") or 0)
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except Exception:  # CONFIG may be disabled (managed Redis): nothing to say
        return None
    return str(policy) if maxmemory else None


def read_persistence(client: Any, url: str = "") -> Persistence:
    """Ask ``client``'s Redis (every primary of a Cluster) whether it appends every
    write to its AOF. Raises `SemaphoreConnectionError` when it cannot answer now:
    nothing is known then."""
    try:
        if isinstance(client, RedisCluster):
            reply = client.config_get("appendonly", target_nodes=RedisCluster.PRIMARIES)
        else:
            reply = client.config_get("appendonly")
    except UNREACHABLE as error:
        raise SemaphoreConnectionError(url or "redis", error) from error
    except redis.RedisError as error:
        return Persistence(None, f"CONFIG GET appendonly failed: {error}")
    per_node = isinstance(reply, dict) and all(isinstance(v, dict) for v in reply.values())
    values = [_appendonly(node) for node in (reply.values() if per_node and reply else [reply])]
    if any(value is None for value in values):
        return Persistence(None, f"CONFIG GET appendonly answered {reply!r}")
    if all(value == "yes" for value in values):
        return Persistence(True, "appendonly yes")
    return Persistence(False, "appendonly no")


def _appendonly(reply: Any) -> str | None:
    """The ``appendonly`` value of one server's CONFIG GET reply."""
    if not isinstance(reply, dict):
        return None
    value = reply.get("appendonly", reply.get(b"appendonly"))
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value.lower() if isinstance(value, str) else None
