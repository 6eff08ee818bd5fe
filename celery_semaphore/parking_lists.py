"""Parking queues on a Redis broker: lists of the broker's Redis, taken from atomically.

On a Redis broker (kombu's Redis transport) a parking queue
(`celery_semaphore.parking_queues`) is what kombu makes of any queue: a list in
the broker's Redis (one per priority step), published to with LPUSH, its head at
the right end. kombu's own ``basic_get`` would not do for a move: it pops the
message and then records it as unacknowledged in a second call (a process killed
between the two loses it), and a message given back goes to the tail of its
queue. A move here takes the head atomically into a list of its own process, and
gives it back to the head::

    HSET moving-registry <own list> {from, at} + LMOVE <parking> RIGHT -> <own list> LEFT
                                                        (one MULTI: both or neither)
    -> claim -> publish to the handover queue -> LREM <own list>      (done)
                                              or LMOVE <own list> LEFT -> <parking> RIGHT
                                                                      (given back)

A process killed mid-move leaves the message in its own list, named in the
namespace's moving registry; `ParkingLists.sweep()` (each worker's heartbeat) puts
back at the head of its queue what has stayed there longer than `STUCK_AFTER`
seconds. The namespace's directory of parking queues is a hash of the broker's
Redis (`directory()` is its name): which queues a rebuild reads does not depend on
the semaphores' Redis. Rebuilding reads a list without taking from it
(`ParkingLists.messages()`).

A message here is exactly as safe as any message of the broker (LMOVE and MULTI
are atomic in Redis, and what the broker's Redis keeps on disk it keeps for
these lists too); it needs Redis 6.2 or later on the broker (LMOVE).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis

logger = logging.getLogger(__name__)

#: Seconds after which a message a process took and still holds is put back
#: (`ParkingLists.sweep()`): a move takes milliseconds; a process paused longer than
#: this mid-move may publish a copy of a message put back meanwhile (at least once).
STUCK_AFTER = 30.0
#: The suffix of the hash naming each process's own moving list (`ParkingLists`).
MOVING_SUFFIX = ".parking-moving"
#: Messages a rebuild reads from one list at most.
MOST_READ = 100_000


class Taken:
    """A message taken from a parking list into this process's own list: acknowledge
    it once published on (`ack()`), or give it back to the head of its list
    (``reject(requeue=True)``), as a kombu message taken without ack would be."""

    def __init__(self, lists: ParkingLists, raw: bytes, origin: str, moving: str) -> None:
        self.lists, self.raw, self.origin, self.moving = lists, raw, origin, moving
        self.message = lists.channel.Message(json.loads(raw), channel=lists.channel)
        self.headers = self.message.headers
        self.body = self.message.body
        self.properties = self.message.properties
        self.content_type = self.message.content_type
        self.content_encoding = self.message.content_encoding

    def ack(self) -> None:
        self.lists.client.lrem(self.lists.key(self.moving), 1, self.raw)

    def reject(self, requeue: bool = False) -> None:
        lists = self.lists
        if requeue:
            lists.client.lmove(lists.key(self.moving), lists.key(self.origin), "LEFT", "RIGHT")
        else:
            self.ack()


class ParkingLists:
    """The parking queues of namespace ``namespace`` on a Redis broker, through the
    kombu Redis ``channel`` of this process's `BrokerLink` (its connection pool and
    key prefix): keys are the names kombu gives them, with its ``global_keyprefix``."""

    def __init__(self, channel: Any, namespace: str, owner: str) -> None:
        self.channel = channel
        self.client: Any = redis.Redis(connection_pool=channel.pool)
        self.prefix = str(getattr(channel, "global_keyprefix", "") or "")
        self.namespace = namespace
        self.registry = namespace + MOVING_SUFFIX
        self.moving = f"{self.registry}.{owner}"

    def key(self, name: str) -> str:
        return self.prefix + name

    def lists_of(self, queue: str) -> list[str]:
        """The lists kombu keeps ``queue``'s messages in, the first consumed first."""
        return [self.channel._q_for_pri(queue, step) for step in self.channel.priority_steps]

    def take(self, queue: str) -> Taken | None:
        """The head of parking queue ``queue``, moved into this process's own list, or
        None (empty)."""
        for origin in self.lists_of(queue):
            entry = json.dumps({"from": origin, "at": time.time()})
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hset(self.key(self.registry), self.moving, entry)
                pipe.lmove(self.key(origin), self.key(self.moving), "RIGHT", "LEFT")
                _, raw = pipe.execute()
            if raw is not None:
                return Taken(self, raw, origin, self.moving)
        return None

    def check(self) -> None:
        """Raise if the broker's Redis cannot move (LMOVE: Redis 6.2 or later, and a
        user allowed to run it): an LMOVE between two keys that hold nothing."""
        self.client.lmove(self.key(self.moving + ".check"), self.key(self.moving), "RIGHT", "LEFT")

    def list_queue(self, listing: str, entry: dict[str, Any]) -> None:
        """Add ``entry`` (a parking queue's) to the directory ``listing`` (a hash)."""
        self.client.hset(self.key(listing), entry["parking"], json.dumps(entry))

    def directory(self, listing: str) -> list[dict[str, Any]]:
        """The entries of directory ``listing``, with the messages each queue holds
        (``messages``)."""
        entries = []
        for field, value in self.client.hgetall(self.key(listing)).items():
            try:
                entry = json.loads(value)
                keys = [self.key(name) for name in self.lists_of(str(entry["parking"]))]
            except (ValueError, KeyError, TypeError):
                logger.warning("dropped an unreadable entry of %s: %r", listing, value)
                self.client.hdel(self.key(listing), field)
                continue
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.llen(key)
                entry["messages"] = sum(pipe.execute())
            entries.append(entry)
        return entries

    def messages(self, queue: str) -> Iterator[tuple[dict[str, Any], Any]]:
        """Each message of parking queue ``queue``, the head first, without taking it:
        its headers, and a callable that drops it."""
        read = 0
        for origin in self.lists_of(queue):
            key = self.key(origin)
            for raw in reversed(self.client.lrange(key, -MOST_READ, -1)):
                read += 1
                headers = json.loads(raw).get("headers") or {}

                def drop(raw: bytes = raw, key: str = key) -> None:
                    self.client.lrem(key, 1, raw)

                yield headers, drop
            if read >= MOST_READ:
                return

    def sweep(self, stuck_after: float | None = None) -> int:
        """Put back, at the head of its list, each message a process has held for more
        than ``stuck_after`` s (`STUCK_AFTER` unless given: killed or stopped
        mid-move), and forget the entries of moving lists left empty as long; how
        many messages were put back."""
        stuck_after = STUCK_AFTER if stuck_after is None else stuck_after
        registry = self.key(self.registry)
        put_back = 0
        now = time.time()
        for field, value in self.client.hgetall(registry).items():
            try:
                entry = json.loads(value)
                origin, at = str(entry["from"]), float(entry["at"])
            except (ValueError, KeyError, TypeError):
                self.client.hdel(registry, field)
                continue
            if now - at < stuck_after:
                continue
            moving = self.key(field.decode() if isinstance(field, bytes) else str(field))
            while self.client.lmove(moving, self.key(origin), "LEFT", "RIGHT") is not None:
                put_back += 1
            self._forget(field, value, moving)
        if put_back:
            logger.warning(
                "celery-semaphore: put back %d parked message(s) that a process stopped "
                "while moving them to a handover queue",
                put_back,
            )
        return put_back

    def _forget(self, field: Any, value: Any, moving: str) -> None:
        """Forget registry entry ``field`` if it still says ``value`` and its list
        ``moving`` is empty (in one transaction: its process may take again now)."""
        registry = self.key(self.registry)

        def forget(pipe: Any) -> None:
            if pipe.hget(registry, field) == value and pipe.llen(moving) == 0:
                pipe.multi()
                pipe.hdel(registry, field)

        self.client.transaction(forget, registry, moving)


def owner_name() -> str:
    """This process's name in moving lists: host, pid and a random part."""
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
