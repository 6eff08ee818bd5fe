"""Redis key names of one semaphore.

All keys of a semaphore share one hash tag, so every script touches a single
Redis Cluster slot. Braces and ``%`` in the name are percent-encoded inside the
tag: a name like ``"a}b"`` can neither end the tag early nor collide with
another name. A namespace with a hash tag of its own (``"celery_semaphore{limits}"``)
comes first in every key, so its tag is the one Redis uses: every semaphore of that
namespace is on one slot, where one script can take several of them at once
(`SemaphoreSet`; a task's limits on several names).
"""

from __future__ import annotations

import functools
from functools import lru_cache
from itertools import count
from typing import NamedTuple

from redis.crc import key_slot

SLOTS = 16384
ROLES = ("holders", "hinfo", "waiters", "wexp", "winfo", "meta", "parked", "handed", "sent")
ROLE_TYPES = ("zset", "hash", "zset", "zset", "hash", "hash", "hash", "zset", "zset")


class SemaphoreKeys(NamedTuple):
    """The semaphore's nine keys, the wake-up channel, and the epoch hash it
    shares with the other semaphores of its Redis (its Cluster slot): every
    script takes the nine and the epoch (`call_keys`).

    ``parked`` and ``handed`` exist only while waiters are parked (see park.lua);
    ``sent`` only while tasks published with a place have not reached a worker.
    """

    holders: str
    hinfo: str
    waiters: str
    wexp: str
    winfo: str
    meta: str
    parked: str
    handed: str
    sent: str
    channel: str
    epoch: str

    @property
    def script_keys(self) -> list[str]:
        """The semaphore's own keys (the epoch hash is not one of them)."""
        return list(self[: len(ROLES)])

    @property
    def call_keys(self) -> list[str]:
        return [*self.script_keys, self.epoch]


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


@functools.lru_cache(maxsize=4096)
def keys_of(namespace: str, name: str, cluster: bool = False) -> SemaphoreKeys:
    """`semaphore_keys()`, kept for the semaphores used most (every call of a
    semaphore names its keys)."""
    return semaphore_keys(namespace, name, cluster=cluster)


@functools.lru_cache(maxsize=4096)
def call_keys_of(namespace: str, name: str, cluster: bool = False) -> tuple[str, ...]:
    """The keys a script call of the semaphore takes (`SemaphoreKeys.call_keys`), kept
    likewise."""
    return tuple(keys_of(namespace, name, cluster).call_keys)


def semaphore_keys(namespace: str, name: str, *, cluster: bool = False) -> SemaphoreKeys:
    """``cluster``: the epoch hash is one per slot (a script touches one slot),
    else one per Redis."""
    base = f"{namespace}:{{{_escape(name)}}}"
    holders, hinfo, waiters, wexp, winfo, meta, parked, handed, sent = (
        f"{base}:{r}" for r in ROLES
    )
    epoch = f"{namespace}:epoch"
    if cluster:
        epoch = f"{epoch}:{{{_slot_tag(key_slot(base.encode()))}}}"
    return SemaphoreKeys(
        holders, hinfo, waiters, wexp, winfo, meta, parked, handed, sent, f"{base}:wake", epoch
    )


def _slot_tag(slot: int) -> str:
    return _slot_tags()[slot]


@lru_cache(maxsize=1)
def _slot_tags() -> list[str]:
    """For each Cluster slot, the first of "0", "1", ... whose hash tag lands in it
    (made once, in about 0.2 s)."""
    tags: dict[int, str] = {}
    for tag in map(str, count()):
        tags.setdefault(key_slot(tag.encode()), tag)
        if len(tags) == SLOTS:
            return [tags[slot] for slot in range(SLOTS)]
    raise AssertionError("unreachable")


def unescape(tag: str) -> str:
    return tag.replace("%7D", "}").replace("%7B", "{").replace("%25", "%")


def name_from_meta_key(namespace: str, key: str, role: str = "meta") -> str | None:
    """The semaphore name of a ``meta`` key (or of another ``role``'s key), or None."""
    prefix, suffix = f"{namespace}:{{", f"}}:{role}"
    if key.startswith(prefix) and key.endswith(suffix):
        return unescape(key[len(prefix) : -len(suffix)])
    return None


def watch_channel(namespace: str) -> str:
    """The pub/sub channel every worker's heartbeat listens on (``worker/watch.py``):
    a message there makes it beat at once; the CLI publishes after a change that
    may admit tasks."""
    return f"{namespace}:watch"
