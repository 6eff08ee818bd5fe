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
seconds.

A message moved with a handover token is not dropped from the mover's list but kept,
as a copy, until a worker starts its task (`ParkingLists.forget_moved()`, at its
admission)::

    publish to the handover queue -> HSET moved <task id> + ZADD moved-at + LREM <own list>
                                                        (one MULTI)

kombu's Redis transport pops a message and records it as unacknowledged in two
steps, and a worker SIGKILLed between them loses it (kombu's gap, which any message
of a Redis broker has); the moved message was its task's only copy, and its place
in line would wait for it, handed over, until the place lapsed. The next handover
of that place (after the deadline) moves the copy again instead
(`ParkingLists.moved_copy()`); a copy that arrives after another is stale, as for
any handover. A copy kept longer than `KEEP_MOVED` (its task revoked or its place
gone) is dropped by the sweep.

The namespace's directory of parking queues is a hash of the broker's Redis
(`directory()` is its name): which queues a rebuild reads does not depend on the
semaphores' Redis. Rebuilding reads a list without taking from it
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
#: The suffix of the hash keeping a copy of each message moved with a handover token
#: until its task starts (`ParkingLists.keep_moved()`), and of its sorted set of times.
MOVED_SUFFIX = ".parking-moved"
MOVED_AT_SUFFIX = ".parking-moved-at"
#: Seconds a copy of a moved message is kept at most: one still there was handed
#: over no more (its task revoked, its place gone) or its task never started.
KEEP_MOVED = 3600.0
#: Copies one sweep drops at most.
MOST_DROPPED = 1000
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

    def ack_keeping_copy(self, task_id: str) -> None:
        """Done, moved with a handover token: keep a copy of it until task ``task_id``
        starts (`ParkingLists.keep_moved()`)."""
        self.lists.keep_moved(task_id, self.raw, self.origin, dropping=self.moving)

    def reject(self, requeue: bool = False) -> None:
        lists = self.lists
        if requeue:
            lists.client.lmove(lists.key(self.moving), lists.key(self.origin), "LEFT", "RIGHT")
        else:
            self.ack()


class MovedCopy(Taken):
    """The copy of a message moved before (`ParkingLists.moved_copy()`), to move again:
    once published, it stays kept (``ack``: kept anew from now) until its task starts."""

    def ack(self) -> None:
        self.lists.keep_moved(str(self.headers.get("id")), self.raw, self.origin)

    def reject(self, requeue: bool = False) -> None:
        """Not moved again: the copy stays as it was."""


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
        self.moved = self.key(namespace + MOVED_SUFFIX)
        self.moved_at = self.key(namespace + MOVED_AT_SUFFIX)

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

    def keep_moved(self, task_id: str, raw: bytes, origin: str, *, dropping: str = "") -> None:
        """Keep ``raw`` (moved from list ``origin``) as task ``task_id``'s moved copy,
        from now; ``dropping``: the own list it leaves, in the same transaction."""
        entry = json.dumps({"raw": raw.decode(), "from": origin})
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.moved, task_id, entry)
            pipe.zadd(self.moved_at, {task_id: time.time()})
            if dropping:
                pipe.lrem(self.key(dropping), 1, raw)
            pipe.execute()

    def moved_copy(self, task_id: str) -> MovedCopy | None:
        """The copy kept of task ``task_id``'s message moved before, if it has not started
        (or None)."""
        value = self.client.hget(self.moved, task_id)
        if value is None:
            return None
        try:
            entry = json.loads(value)
            return MovedCopy(self, entry["raw"].encode(), str(entry["from"]), "")
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning("dropped an unreadable moved copy of %s: %r", task_id, value)
            self.forget_moved(task_id)
            return None

    def forget_moved(self, task_id: str) -> None:
        """Task ``task_id`` started: its moved copy is not needed any more."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hdel(self.moved, task_id)
            pipe.zrem(self.moved_at, task_id)
            pipe.execute()

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
        self._drop_old_copies()
        return put_back

    def _drop_old_copies(self) -> None:
        """Drop the moved copies kept longer than `KEEP_MOVED` (at most `MOST_DROPPED`)."""
        old = self.client.zrangebyscore(
            self.moved_at, "-inf", time.time() - KEEP_MOVED, start=0, num=MOST_DROPPED
        )
        if old:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hdel(self.moved, *old)
                pipe.zrem(self.moved_at, *old)
                pipe.execute()
            logger.info(
                "celery-semaphore: dropped %d copies of moved messages kept over %.0f s "
                "(their tasks were not handed over again: revoked, or their places gone)",
                len(old), KEEP_MOVED,
            )  # fmt: skip

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
