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
    when it reaches it; of a Cluster: a primary's that may evict, if one may); None
    when none has one, or when it says neither through CONFIG GET nor through INFO
    memory (or cannot answer now): nothing is known then."""
    try:
        nodes, _ = read_settings(client, ("maxmemory", "maxmemory-policy"))
    except (SemaphoreConnectionError, SettingsUnknown):
        return None
    policies = [node["maxmemory-policy"] for node in nodes.values() if _has_maxmemory(node)]
    evicting = [policy for policy in policies if policy not in (None, "noeviction")]
    return (evicting or policies or [None])[0]


def _has_maxmemory(settings: dict[str, str | None]) -> bool:
    maxmemory = settings["maxmemory"] or ""
    return maxmemory.isdigit() and int(maxmemory) > 0


def read_persistence(client: Any, url: str = "") -> Persistence:
    """Ask ``client``'s Redis (every primary of a Cluster) whether it appends every
    write to its AOF. Raises `SemaphoreConnectionError` when it cannot answer now:
    nothing is known then."""
    try:
        nodes, how = read_settings(client, ("appendonly",), url)
    except SettingsUnknown as error:
        return Persistence(None, str(error))
    values = [settings["appendonly"] for settings in nodes.values()]
    if any(value not in ("yes", "no") for value in values):
        return Persistence(None, f"{how} appendonly answered {values!r}")
    through = "" if how == CONFIG_GET else f" ({how})"
    if all(value == "yes" for value in values):
        return Persistence(True, f"appendonly yes{through}")
    return Persistence(False, f"appendonly no{through}")


class SettingsUnknown(Exception):
    """The Redis answers, but neither CONFIG GET nor INFO would tell its settings."""


CONFIG_GET = "CONFIG GET"

#: Where INFO tells each setting read here (its section and field), for a Redis that
#: refuses CONFIG (managed services often do) but answers INFO.
INFO_FIELDS = {
    "appendonly": ("persistence", "aof_enabled"),
    "maxmemory": ("memory", "maxmemory"),
    "maxmemory-policy": ("memory", "maxmemory_policy"),
}
#: ``aof_enabled`` is 1 or 0 where ``appendonly`` is yes or no.
AOF_ENABLED = {"1": "yes", "0": "no"}


def read_settings(
    client: Any, names: tuple[str, ...], url: str = ""
) -> tuple[dict[str, dict[str, str | None]], str]:
    """``names`` (CONFIG parameters, of `INFO_FIELDS`) as each server has them (every
    primary of a Cluster; by node name, '' for a single server; None: not said), and
    how they were read: by CONFIG GET, else (CONFIG refused) by INFO. Raises
    `SemaphoreConnectionError` when the Redis cannot answer now, `SettingsUnknown`
    when it refuses both."""
    try:
        return _read(client, names, via_info=False), CONFIG_GET
    except UNREACHABLE as error:
        raise SemaphoreConnectionError(url or "redis", error) from error
    except redis.RedisError as error:
        refused = error
    sections = sorted({INFO_FIELDS[name][0] for name in names})
    how = f"read by INFO {' '.join(sections)}: CONFIG GET refused"
    try:
        return _read(client, names, via_info=True), how
    except UNREACHABLE as error:
        raise SemaphoreConnectionError(url or "redis", error) from error
    except redis.RedisError as error:
        raise SettingsUnknown(
            f"CONFIG GET {' '.join(names)} failed: {refused}; INFO {' '.join(sections)} "
            f"failed: {error}"
        ) from error


def _read(
    client: Any, names: tuple[str, ...], *, via_info: bool
) -> dict[str, dict[str, str | None]]:
    nodes: dict[str, dict[str, str | None]] = {}
    sections: dict[str, Any] = {}  # INFO replies, one per section
    for name in names:
        if via_info:
            section, field = INFO_FIELDS[name]
            if section not in sections:
                sections[section] = _ask(client, "info", section)
            reply = sections[section]
        else:
            field, reply = name, _ask(client, "config_get", name)
        for node, one in _per_node(reply, field).items():
            value = _value(one, field)
            if field == "aof_enabled":
                value = AOF_ENABLED.get(value or "")
            nodes.setdefault(node, {})[name] = value
    return nodes


def _ask(client: Any, command: str, argument: str) -> Any:
    """``client.<command>(argument)``, of every primary of a Cluster."""
    if isinstance(client, RedisCluster):
        return getattr(client, command)(argument, target_nodes=RedisCluster.PRIMARIES)
    return getattr(client, command)(argument)


def _per_node(reply: Any, field: str) -> dict[str, Any]:
    """One server's reply by node name: a Cluster's reply from several primaries is a
    dict of their replies by node name ('' for a single server's)."""
    if (
        isinstance(reply, dict)
        and reply
        and field not in reply
        and field.encode() not in reply
        and all(isinstance(one, dict) for one in reply.values())
    ):
        return {str(node): one for node, one in reply.items()}
    return {"": reply}


def _value(reply: Any, field: str) -> str | None:
    """``field`` of one server's CONFIG GET or INFO reply, as lower-case text."""
    if not isinstance(reply, dict):
        return None
    value = reply.get(field, reply.get(field.encode()))
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value.lower() if isinstance(value, str) else None
