"""Finding the semaphores that exist in Redis and reading them, for operators (CLI,
metrics), and telling the workers to look again (`wake_workers()`).

Listing uses SCAN over the ``meta`` keys: fine for an operator's command or a
metrics scrape, never used on a task's path. A worker's heartbeat finds the
semaphores with parked waiters in their index (`parked_index`), and SCANs
only once, when it starts (`index_parked()`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.redis.arguments import counts_args
from celery_semaphore.core.results import SemaphoreCounts

from . import epochs, functions, parked_index
from .connection import SyncClient, is_cluster, translate
from .keys import name_from_meta_key, semaphore_keys, watch_channel
from .replies import parse_counts, text
from .scripts import forget_way, registered

#: Script calls sent in one pipeline by `read_counts()`.
COUNTS_BATCH = 500
#: The meta field the scripts count parked (not yet handed over) tasks in
#: (common_parked.lua's COUNTED).
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


def recorded_limit(
    client: SyncClient, namespace: str, name: str, url: str = "", *, override_only: bool = False
) -> int | None:
    """The limit the users of semaphore ``name`` declared (the last to ask), or with
    ``override_only`` the override an operator set before its first use; None if
    neither."""
    meta = semaphore_keys(namespace, name).meta
    try:
        declared, override = client.hmget(meta, ["limit", "override"])
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    limit = declared if declared is not None or not override_only else override
    return None if limit is None else int(text(limit))


def read_counts(
    client: SyncClient,
    namespace: str,
    names: Sequence[str],
    fields: Sequence[str] = (),
    url: str = "",
) -> list[SemaphoreCounts]:
    """The counts of each semaphore of ``names`` that exists (one that no contender
    has declared a limit for is left out, as `recorded_limit()` says None), with
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


def recorded_families(
    client: SyncClient, namespace: str, names: Sequence[str], url: str
) -> list[str | None]:
    """The per-key family each of ``names`` belongs to, as its tasks recorded it
    (the ``family`` field of its meta hash; None: none), in one round trip."""
    try:
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hget(semaphore_keys(namespace, name).meta, "family")
            recorded = pipe.execute()
    except redis.RedisError as error:
        raise translate(error, url) from error
    return [text(family) if family else None for family in recorded]


def recorded_rate(client: SyncClient, meta: str, url: str) -> RateLimit | None:
    """The rate the tasks of the semaphore whose meta hash is ``meta`` declare, as
    the last of them to ask recorded it (the ``rate`` field; None: none, or not
    used yet)."""
    try:
        recorded = client.hget(meta, "rate")
    except redis.RedisError as error:
        raise translate(error, url) from error
    return RateLimit.decode(text(recorded or ""))


def wake_workers(client: SyncClient, namespace: str, name: str, url: str) -> int:
    """Tell every worker's heartbeat to beat now for ``name`` (the watch channel);
    how many heard it."""
    try:
        return int(client.publish(watch_channel(namespace), name))
    except redis.RedisError as error:
        raise translate(error, url) from error


def last_data_loss(client: SyncClient, namespace: str, url: str = "") -> tuple[float, float, float]:
    """When a client last noticed that the Redis of ``namespace``'s semaphores lost its
    data (0: never), the longest pause that followed, and how many permits were written
    back: read from the epoch hash(es) (one per Cluster slot in use)."""
    lost, pause, restored = 0.0, 0.0, 0.0
    try:
        for key in client.scan_iter(match=f"{namespace}:epoch*", _type="hash"):
            lost_ms, resumes_ms, count = (
                float(text(v or 0)) for v in client.hmget(key, "lost_ms", "resumes_ms", "restored")
            )
            if lost_ms:
                lost = max(lost, lost_ms / 1000)
                pause = max(pause, (resumes_ms - lost_ms) / 1000)
                restored += max(count, 0.0)
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    return lost, pause, restored


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
