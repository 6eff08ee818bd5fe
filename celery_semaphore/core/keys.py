"""Redis key names of one semaphore.

All keys of a semaphore share one hash tag, so every script touches a single
Redis Cluster slot. Braces and ``%`` in the name are percent-encoded inside the
tag: a name like ``"a}b"`` can neither end the tag early nor collide with
another name.
"""

from __future__ import annotations

from typing import NamedTuple

ROLES = ("holders", "hinfo", "waiters", "wexp", "winfo", "meta", "parked", "handed", "sent")
ROLE_TYPES = ("zset", "hash", "zset", "zset", "hash", "hash", "hash", "zset", "zset")


class SemaphoreKeys(NamedTuple):
    """The nine keys every script takes (in this order) and the wake-up channel.

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

    @property
    def script_keys(self) -> list[str]:
        return list(self[: len(ROLES)])


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def semaphore_keys(namespace: str, name: str) -> SemaphoreKeys:
    base = f"{namespace}:{{{_escape(name)}}}"
    holders, hinfo, waiters, wexp, winfo, meta, parked, handed, sent = (
        f"{base}:{r}" for r in ROLES
    )
    return SemaphoreKeys(
        holders, hinfo, waiters, wexp, winfo, meta, parked, handed, sent, f"{base}:wake"
    )


def unescape(tag: str) -> str:
    return tag.replace("%7D", "}").replace("%7B", "{").replace("%25", "%")


def name_from_meta_key(namespace: str, key: str, role: str = "meta") -> str | None:
    """The semaphore name of a ``meta`` key (or of another ``role``'s key), or None."""
    prefix, suffix = f"{namespace}:{{", f"}}:{role}"
    if key.startswith(prefix) and key.endswith(suffix):
        return unescape(key[len(prefix) : -len(suffix)])
    return None
