"""The CLI's own Redis calls: the few it makes around the semaphore's API.

Everything else the commands do goes through `celery_semaphore.core` (`Semaphore`,
`celery_semaphore.core.discovery`). These three are gathered here so that moving
them behind the store's API is one change: two reads of a semaphore's meta hash
(``HGET``; one of them pipelined over many semaphores) and the wake-up the workers'
heartbeats listen for (``PUBLISH``). Each turns a redis-py error into the
package's (`translate`).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from celery_semaphore.core.connection import SyncClient, translate
from celery_semaphore.core.keys import semaphore_keys, watch_channel
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.replies import text


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
