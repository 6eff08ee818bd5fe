"""Finding the semaphores that exist in Redis, for operators (CLI, metrics).

Listing uses SCAN over the ``meta`` keys: fine for an operator's command or a
metrics scrape, never used on a task's path. A worker's heartbeat finds the
semaphores with parked waiters in their index (`parked_index`), and SCANs
only once, when it starts (`index_parked()`).
"""

from __future__ import annotations

from typing import Any

import redis

from . import parked_index
from ._sync.semaphore import Semaphore
from .connection import SyncClient, translate
from .errors import UnknownSemaphore
from .keys import name_from_meta_key, semaphore_keys
from .protocol import text


def semaphore_names(
    client: SyncClient, namespace: str, url: str = "", *, role: str = "meta"
) -> list[str]:
    """Names of every semaphore with state in Redis, sorted; with ``role="parked"``,
    of those with parked waiters (or their tombstones)."""
    try:
        keys = client.scan_iter(match=f"{namespace}:{{*}}:{role}", count=1000)
        names = {name_from_meta_key(namespace, text(key), role) for key in keys}
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    return sorted(n for n in names if n is not None)


def open_semaphore(
    client: SyncClient,
    namespace: str,
    name: str,
    url: str = "",
    *,
    override_only: bool = False,
    **kwargs: Any,
) -> Semaphore:
    """The existing semaphore ``name``, with the limit its users declared.

    With ``override_only``, also one that no contender has used yet but whose
    limit an operator set (``set-limit`` before its first use): opened with
    that override as its limit. Raises UnknownSemaphore otherwise.
    """
    meta = semaphore_keys(namespace, name).meta
    try:
        declared, override = client.hmget(meta, ["limit", "override"])
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    limit = declared if declared is not None or not override_only else override
    if limit is None:
        raise UnknownSemaphore(name, namespace)
    return Semaphore(client, name, int(text(limit)), namespace=namespace, url=url, **kwargs)


def index_parked(client: SyncClient, namespace: str, url: str = "") -> list[str]:
    """List in the parked index every semaphore of ``namespace`` with a parked
    hash (found with SCAN): those parked before the index existed, or an index
    lost alone. Only the first call for this client and namespace in this
    process does it; the names listed."""
    listings = parked_index.listings(client)
    if namespace in listings.scanned:
        return []
    names = semaphore_names(client, namespace, url, role="parked")
    for name in names:
        parked_index.register(client, namespace, name, url)
    listings.scanned.add(namespace)
    return names
