"""Finding the semaphores that exist in Redis and reading them, for operators (CLI,
metrics).

Listing uses SCAN over the ``meta`` keys: fine for an operator's command or a
metrics scrape, never used on a task's path. A worker's heartbeat finds the
semaphores with parked waiters in their index (`parked_index`), and SCANs
only once, when it starts (`index_parked()`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from . import epochs, functions, parked_index
from ._sync.semaphore import Semaphore
from .connection import SyncClient, is_cluster, translate
from .errors import UnknownSemaphore
from .keys import name_from_meta_key, semaphore_keys
from .protocol import counts_args
from .replies import parse_counts, text
from .results import SemaphoreCounts
from .scripts import forget_way, registered

#: Script calls sent in one pipeline by `read_counts()`.
COUNTS_BATCH = 500
#: The meta field the scripts count parked (not yet handed over) tasks in
#: (common.lua's COUNTED).
PARKED_COUNT = "n_parked"


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


def read_counts(
    client: SyncClient,
    namespace: str,
    names: Sequence[str],
    fields: Sequence[str] = (),
    url: str = "",
) -> list[SemaphoreCounts]:
    """The counts of each semaphore of ``names`` that exists (one that no contender
    has declared a limit for is left out, as `open_semaphore()` refuses it), with
    the ``meta`` ``fields`` asked for, read by counts.lua: O(log n) Redis work each.

    On a single Redis (or one behind Sentinel) the calls go in pipelines of
    `COUNTS_BATCH`: one round trip for a scrape of up to that many semaphores. A
    Redis Cluster client calls them one by one (redis-py's cluster pipeline refuses
    EVALSHA); each call still reads one slot, and costs the same Redis work.
    """
    script = registered(client)["counts"]
    cluster = is_cluster(client)
    args = counts_args(fields)
    calls = []
    for name in names:
        keys = semaphore_keys(namespace, name, cluster=cluster)
        calls.append({"keys": keys.call_keys, "args": [*args, epochs.argument(url, keys.epoch, 0)]})
    try:
        if cluster:
            replies = [script(**call, client=client) for call in calls]
        else:
            replies = []
            for start in range(0, len(calls), COUNTS_BATCH):
                replies += _pipelined(client, script, calls[start : start + COUNTS_BATCH])
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    counts = (parse_counts(n, fields, r) for n, r in zip(names, replies, strict=True))
    return [c for c in counts if c.declared_limit is not None]


def parked_counts(
    client: SyncClient, namespace: str, names: Iterable[str], url: str = ""
) -> dict[str, int]:
    """How many tasks each semaphore of ``names`` keeps parked (not yet handed over);
    a semaphore whose meta key holds another type (another program's key) is left
    out, so one bad name cannot hide the others."""
    counts = {}
    for name in names:
        meta = semaphore_keys(namespace, name, cluster=is_cluster(client)).meta
        try:
            count = client.hget(meta, PARKED_COUNT)
        except redis.ResponseError as error:
            if "WRONGTYPE" not in str(error):
                raise translate(error, url or "redis") from error
            continue
        except redis.RedisError as error:
            raise translate(error, url or "redis") from error
        counts[name] = int(count or 0)
    return counts


def _pipelined(client: SyncClient, script: Any, calls: list[dict[str, Any]]) -> list[Any]:
    """The replies of ``calls`` of ``script``, sent in one pipeline; sent again once
    if the library was gone (a restart without persistence): the first call of the
    pipeline does not load it as a call alone does (functions.py)."""
    for attempt in (1, 2):
        try:
            with client.pipeline(transaction=False) as pipe:
                for call in calls:
                    script(**call, client=pipe)
                return pipe.execute()
        except redis.ResponseError as error:
            if attempt == 2 or not functions.missing(error):
                raise
            forget_way(client)
    raise AssertionError("unreachable")  # pragma: no cover


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
