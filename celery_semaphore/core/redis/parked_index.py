"""The index of the semaphores that have parked waiters, one per namespace.

A parked waiter is handed over by whichever call makes it due. What no call
does (a lease that ran out while nobody called, a publisher that died before
publishing, a revoked parked task) the worker heartbeat does, in every
semaphore with parked waiters: it finds them here, not with SCAN (which would
walk the whole keyspace, the broker's and the results' keys included, every
beat of every worker).

Whoever parks lists the semaphore in ``<namespace>:parked-index``, a ZSET of
its own (so it works on Redis Cluster; the semaphores' scripts never touch it)
scored with the server time, at most once per `REGISTER_EVERY` per process and
client. The heartbeat reads it, dispatches each semaphore, and takes a name off
only when its parked hash is empty and nobody listed it again for
`FORGET_AFTER`. Timeline of a park racing the removal::

    process P:  lists S (score s), parks in S; parks again at t: lists S again
                first unless t < s + REGISTER_EVERY
    heartbeat:  reads the index and the server time n; goes on with S only if
                n - s >= FORGET_AFTER
    heartbeat:  HLEN of S's parked hash == 0, at tc > n
    heartbeat:  forget(S, s): removes S only if its score is still s

A park that lands after that HLEN (t > tc > s + FORGET_AFTER) came more than
`REGISTER_EVERY` after s, so P listed S again before parking (score > s) and
the forget leaves S listed. Only a process stalled for ``FORGET_AFTER -
REGISTER_EVERY`` between deciding not to list and parking could slip through.

Names parked before this index existed (or an index lost alone, say evicted)
are listed by `celery_semaphore.core.redis.discovery.index_parked()`, one SCAN per
client and namespace in a process: a worker's heartbeat calls it at its first
look, never per beat. When a process notices that Redis lost its data (the index
with it: `celery_semaphore.core.redis.epochs`), it forgets its listings
(`forget_listings()`) and lists each semaphore again at its next park there
(a process that has not noticed yet lists it again within `REGISTER_EVERY`).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import redis

from .arguments import ForgetArgs, RegisterArgs
from .connection import SyncClient, translate
from .keys import semaphore_keys
from .replies import text
from .scripts import registered

#: Seconds between two listings of one semaphore by one process (and client).
REGISTER_EVERY = 60.0
#: Seconds a name stays listed after its last listing, at least: then it goes once
#: its semaphore has no parked waiter. Well above REGISTER_EVERY (see the timeline).
FORGET_AFTER = 300.0
#: Listing times this process keeps before it drops the ones past REGISTER_EVERY
#: (more if that many are recent: then twice as many as it kept).
PRUNE_ABOVE = 1024

clock = time.monotonic


def index_key(namespace: str) -> str:
    return f"{namespace}:parked-index"


class Listings:
    """When this process last listed each semaphore (namespace, name) on one client.

    No locks here (nor in `listings()`): a worker forks its pool while its
    heartbeat thread runs, and a child would inherit a held lock. A race costs
    at most one listing too many.
    """

    def __init__(self) -> None:
        self._at: dict[tuple[str, str], float] = {}
        self._prune_above = PRUNE_ABOVE
        self.scanned: set[str] = set()  # namespaces index_parked() listed

    def forget(self) -> None:
        self._at = {}
        self.scanned = set()

    def due(self, namespace: str, name: str) -> bool:
        at = self._at.get((namespace, name))
        return at is None or clock() - at >= REGISTER_EVERY

    def done(self, namespace: str, name: str, started: float) -> None:
        """Listed by a call sent at ``started`` (`clock()`, taken before sending)."""
        self._at[(namespace, name)] = started
        if len(self._at) > self._prune_above:
            now = clock()
            self._at = {k: at for k, at in list(self._at.items()) if now - at < REGISTER_EVERY}
            self._prune_above = max(PRUNE_ABOVE, 2 * len(self._at))  # amortized


_listings: weakref.WeakKeyDictionary[Any, Listings] = weakref.WeakKeyDictionary()


def forget_listings() -> None:
    """Forget every listing of this process (Redis lost the index)."""
    for found in list(_listings.values()):
        found.forget()


def listings(client: Any) -> Listings:
    """This process's `Listings` of ``client`` (sync or asyncio)."""
    found = _listings.get(client)
    return found if found is not None else _listings.setdefault(client, Listings())


def register(client: SyncClient, namespace: str, name: str, url: str = "") -> None:
    """List semaphore ``name`` now, whenever it was last listed."""
    script = registered(client)["parked_index/register"]
    try:
        args = list(RegisterArgs(name=name))
        script(keys=[index_key(namespace)], args=args, client=client)
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error


def read(client: SyncClient, namespace: str, url: str = "") -> tuple[int, list[tuple[str, int]]]:
    """The server time (ms) and every listed name with its score (ms), oldest first."""
    script = registered(client)["parked_index/read"]
    try:
        now_ms, flat = script(keys=[index_key(namespace)], args=[], client=client)
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return int(now_ms), [(text(name), int(float(score))) for name, score in pairs]


def forget_idle(
    client: SyncClient,
    namespace: str,
    now_ms: int,
    entries: list[tuple[str, int]],
    url: str = "",
) -> list[str]:
    """Take off the names of ``entries`` (as `read()` gave them, with ``now_ms``)
    listed `FORGET_AFTER` ago or more whose semaphore has no parked waiter, unless
    listed again meanwhile; the names taken off."""
    script = registered(client)["parked_index/forget"]
    forgotten = []
    least_ms = int(FORGET_AFTER * 1000)
    try:
        for name, score in entries:
            if now_ms - score < least_ms:
                continue
            if client.hlen(semaphore_keys(namespace, name).parked):
                continue
            args = list(ForgetArgs(name=name, score=score, least_ms=least_ms))
            if script(keys=[index_key(namespace)], args=args, client=client):
                forgotten.append(name)
    except redis.RedisError as error:
        raise translate(error, url or "redis") from error
    return forgotten
