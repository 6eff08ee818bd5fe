"""Parking queues: a waiting task's message waits in the broker, in a queue no worker consumes.

On an AMQP broker (RabbitMQ), and on a Redis broker whose server is not the
semaphores' Redis, a task refused a permit far from the head of the line does not
leave the broker: its message is published to a *parking queue* of its
home queue, semaphore, fair-share account and priority (`formats.parking_queue()`),
and its place in line records only where to take it from (`formats.InBroker`).
When its turn comes, the process that frees the permit moves the head of that
queue to the home queue's handover queue (`move()`), at least once::

    basic_get(parking, no ack) -> claim(taken, handover) -> publish(handover queue,
    with the token; confirmed by the broker) -> ack

A broker queue hands out its head, not a chosen message: the head may be another
waiter of that queue than the one whose turn came (its arrival order is not always
its tickets' order); `Semaphore.claim()` then gives the turn to the message in hand
and the other keeps its place. A process that dies before the ack leaves the
message to the broker, which puts it back at the head of its queue; the
handover's deadline brings the turn back. A copy published twice is recognised by
its token, as for any handover.

The semaphores' Redis holds no message: when it loses its data,
`celery_semaphore.worker.parked_rebuild` reads every parking queue (listed in the
broker itself, in a `directory()` queue, so which queues to read does not depend
on the lost data) and gives each message its place again.

On a Redis broker a parking queue is a list of the broker's Redis, taken from
atomically, and the directory a hash (`celery_semaphore.parking_lists`); the rest
is the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from kombu import entity, messaging

from .core import Claimed, Handover, Semaphore
from .formats import PARKING_INFIX, Gate, InBroker, handover_queue, with_handover
from .parking_lists import MovedCopy, ParkingLists, Taken, owner_name

logger = logging.getLogger(__name__)

# kombu is untyped: its classes are used as Any
Exchange: Any = entity.Exchange
Queue: Any = entity.Queue
Producer: Any = messaging.Producer

#: The queue that lists a namespace's parking queues (`directory()`).
DIRECTORY_SUFFIX = ".parking-queues"
#: Messages one handover takes at most looking for a waiter in line (a message of a
#: task no longer in line goes on to a worker as it is met).
MOST_TAKEN = 64
#: Seconds before a parking queue the broker refused to declare is tried again.
RETRY_REFUSED = 60.0
#: The properties of a message a move keeps (the rest are the broker's).
KEPT_PROPERTIES = ("delivery_mode", "priority", "correlation_id", "reply_to", "expiration")

# The holder this thread is parking (parking()): its own handover, if one comes before
# its message is in its parking queue, waits until it is.
_parking_now = threading.local()


def directory(namespace: str) -> str:
    """The queue that lists the parking queues of the semaphores of ``namespace``
    (``semaphore_namespace``): one message per parking queue and process that
    declared it (`celery_semaphore.worker.parked_rebuild` compacts it)."""
    return namespace + DIRECTORY_SUFFIX


def parking_queue_entity(name: str) -> Any:
    """A parking queue (or the directory): durable and classic (a quorum queue counts
    each return of a message and drops it past its delivery limit), on the default
    exchange."""
    return Queue(
        name, Exchange(""), routing_key=name, durable=True,
        queue_arguments={"x-queue-type": "classic"},
    )  # fmt: skip


class BrokerLink:
    """This process's own connection to the broker for parking queues: its publishes
    wait for the broker's confirm. Made again after a fork and after an error; one
    per app and process (`celery_semaphore.state.Semaphores.broker_link`)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.RLock()
        self._pid: int | None = None
        self._connection: Any = None
        self._channel: Any = None
        self._listed: set[str] = set()
        self._refused: dict[str, float] = {}  # parking queue -> when the broker refused it
        self._owner = owner_name()
        self._driver = ""  # the broker's kind: "amqp", "redis", ...
        forget = weakref.WeakMethod(self._forget_in_child)
        os.register_at_fork(after_in_child=lambda: (method := forget()) and method())

    def _forget_in_child(self) -> None:
        """In a forked child: a lock of its own (another thread of the parent may have
        held this one, moving a message, at the fork: the child would wait for it
        forever) and no connection (the parent's is not the child's to use)."""
        self.lock = threading.RLock()
        self._pid, self._connection, self._channel = None, None, None

    def _ready_channel(self) -> Any:
        if self._pid != os.getpid() or self._channel is None:
            if self._pid != os.getpid():
                self._owner = owner_name()
            self._pid, self._listed = os.getpid(), set()
            options = dict(self.app.conf.broker_transport_options or {}, confirm_publish=True)
            self._connection = self.app.connection_for_write(transport_options=options)
            self._channel = self._connection.channel()
            self._driver = str(self._connection.transport.driver_type)
        return self._channel

    def lists(self, namespace: str) -> ParkingLists | None:
        """On a Redis broker, its parking queues as lists (`celery_semaphore.parking_lists`:
        what takes, lists and reads them there); None on an AMQP broker. Hold the lock."""
        channel = self._ready_channel()
        if self._driver != "redis":
            return None
        return ParkingLists(channel, namespace, self._owner)

    def reset(self) -> None:
        """Drop the connection: the broker puts back the messages taken and not
        acknowledged, at the head of their queues."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and self._pid == os.getpid():
            try:
                connection.release()
            except Exception as error:  # it goes either way
                logger.debug("closing the parking queues' connection: %r", error)

    @contextmanager
    def channel(self) -> Iterator[Any]:
        """The channel, held under the lock; an error resets the link and goes on."""
        with self.lock:
            try:
                yield self._ready_channel()
            except Exception:
                self.reset()
                raise

    def side_channel(self) -> Any:
        """A new channel on this connection (hold the lock; close it after): closing
        it gives back every message taken on it and not acknowledged."""
        self._ready_channel()
        return self._connection.channel()

    def declare(self, parking: str, home: str, gate: Gate, namespace: str) -> bool:
        """Declare parking queue ``parking`` and list it in ``namespace``'s `directory()`
        (once per process; the entry says how to give its messages their places again).
        False: the broker refused (a WARNING once per queue and `RETRY_REFUSED` s: the
        task waits the old way meanwhile)."""
        with self.lock:
            if parking in self._listed and self._pid == os.getpid():
                return True
            refused_at = self._refused.get(parking)
            if refused_at is not None and time.monotonic() - refused_at < RETRY_REFUSED:
                return False
            try:
                with self.channel() as channel:
                    parking_queue_entity(parking).bind(channel).declare()
                    entry = {"parking": parking, "home": home, "gate": gate.encode()}
                    lists = self.lists(namespace)
                    if lists is not None:
                        lists.check()
                        lists.list_queue(directory(namespace), entry)
                    else:
                        list_queue(channel, directory(namespace), entry)
            except Exception as error:  # refused (permissions, vhost) or the broker away
                self._refused[parking] = time.monotonic()
                logger.warning(
                    "celery-semaphore: could not declare parking queue %r or list it in %r "
                    "(%s). Waiting tasks of queue %r wait as countdown retries until it can: "
                    "%s",
                    parking, directory(namespace), error, home,
                    self._what_to_grant(home, namespace),
                )  # fmt: skip
                return False
            self._refused.pop(parking, None)
            self._listed.add(parking)
            return True

    def _what_to_grant(self, home: str, namespace: str) -> str:
        if self._driver == "redis":
            return (
                "the broker's Redis must be 6.2 or later (LMOVE) and let this user run "
                "LMOVE, LRANGE, LREM, HSET, HGETALL and LLEN on its keys"
            )
        return (
            f"grant this broker user configure, write and read permissions on queues named "
            f"{home + PARKING_INFIX + '*'!r} and {directory(namespace)!r}"
        )


def list_queue(channel: Any, listing: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` (a parking queue's) to the directory queue ``listing`` (confirmed)."""
    Producer(channel).publish(
        json.dumps(entry), exchange="", routing_key=listing, delivery_mode=2,
        declare=[parking_queue_entity(listing)], content_type="application/json",
        content_encoding="utf-8",
    )  # fmt: skip


@contextmanager
def parking(holder: str | None) -> Iterator[list[Callable[[], None]]]:
    """While ``holder``'s place is parked and its message published to its parking
    queue, its own handover (the line may have moved since it was refused) waits:
    how to publish it is kept in the list yielded, for the caller to call once the
    message is there."""
    _parking_now.holder, _parking_now.deferred = holder, []
    try:
        yield _parking_now.deferred
    finally:
        _parking_now.holder = None


def deferred(handover: Handover, later: Callable[[], None]) -> bool:
    """Whether ``handover`` waits (`parking()`), ``later`` kept to publish it."""
    if handover.holder is None or getattr(_parking_now, "holder", None) != handover.holder:
        return False
    _parking_now.deferred.append(later)
    return True


def move(link: BrokerLink, semaphore: Semaphore, handover: Handover, where: InBroker) -> None:
    """Move the message whose turn came (``handover``) from its parking queue to its
    home queue's handover queue, at least once (see the module's docstring). A
    message of a task no longer in line met on the way goes on to a worker as it is
    (it asks there; Celery drops it there if it was revoked); a stale copy is
    dropped. An empty queue: the copy is on its way (another process holds it) or
    gone; the handover's deadline brings the turn back. On a Redis broker, a waiter
    moved before and not started since is moved again from the copy kept of its
    message (`celery_semaphore.parking_lists`)."""
    with link.channel() as channel:
        parking = parking_queue_entity(where.parking).bind(channel)
        lists = link.lists(semaphore.namespace)
        copy = lists.moved_copy(handover.holder) if lists else None
        if copy is not None:
            _move_again(link.app, channel, semaphore, handover, home=where.home, copy=copy)
            return
        for _ in range(MOST_TAKEN):
            message = lists.take(where.parking) if lists else parking.get(no_ack=False)
            if message is None:
                return
            taken = (message.headers or {}).get("id")
            try:
                answer = semaphore.claim(taken, handover) if taken else Claimed.ABSENT
            except Exception:
                message.reject(requeue=True)
                raise
            if answer is Claimed.VOID:
                message.reject(requeue=True)
                return
            if answer is not Claimed.STALE:
                token = handover if answer is Claimed.PUBLISH else None
                try:
                    publish_moved(
                        link.app, channel, message, where.home, semaphore.name, handover=token,
                        copy_kept=lists is not None and token is not None,
                    )  # fmt: skip
                except Exception:
                    with contextlib.suppress(Exception):  # else: when the connection closes
                        message.reject(requeue=True)
                    raise
            if answer is Claimed.PUBLISH:
                if isinstance(message, Taken):
                    message.ack_keeping_copy(str(taken))
                else:
                    message.ack()
                return
            message.ack()


def _move_again(
    app: Any, channel: Any, semaphore: Semaphore, handover: Handover, *, home: str, copy: MovedCopy
) -> None:
    """``handover``'s waiter was moved before and has not started: its message may be
    lost on its way (see `celery_semaphore.parking_lists`), or only late. Move the
    copy kept of it again, with the new token (the first copy to arrive takes the
    place, a later one is stale); none if the place is no longer handed over to it."""
    answer = semaphore.claim(handover.holder, handover)
    if answer is Claimed.PUBLISH:
        publish_moved(app, channel, copy, home, semaphore.name, handover=handover, copy_kept=True)
        copy.ack()
        logger.info(
            "celery-semaphore: moved %s again from the copy kept of its message (handed "
            "over by semaphore %s, not started by the deadline: late, or lost on its way)",
            handover.holder, semaphore.name,
        )  # fmt: skip
    elif answer is Claimed.STALE:  # a copy arrived, or it was served
        copy.lists.forget_moved(handover.holder)


def forget_moved_copy(link: BrokerLink, namespace: str, task_id: str) -> None:
    """Task ``task_id``, moved out of a parking queue of a Redis broker, starts: the copy
    kept of its message is not needed any more. A failure is logged: the copy is
    dropped later (moved again at the deadline, it arrives stale)."""
    try:
        with link.channel():
            lists = link.lists(namespace)
            if lists is not None:
                lists.forget_moved(task_id)
    except Exception as error:
        logger.warning(
            "celery-semaphore: could not forget the copy kept of %s's moved message "
            "(it may be moved again, and dropped as stale): %r", task_id, error,
        )  # fmt: skip


def sweep(link: BrokerLink, namespace: str) -> int:
    """On a Redis broker, put back the messages a process of ``namespace`` stopped
    moving (`celery_semaphore.parking_lists.ParkingLists.sweep`); on RabbitMQ the
    broker does it when the process's connection closes."""
    with link.channel():
        lists = link.lists(namespace)
        return 0 if lists is None else lists.sweep()


def publish_moved(
    app: Any,
    channel: Any,
    message: Any,
    home: str,
    semaphore: str,
    *,
    handover: Handover | None,
    copy_kept: bool = False,
) -> None:
    """Publish ``message`` to ``home``'s handover queue (confirmed), marked with
    ``handover``'s token (None: as it is) and due after its delay (a rate's slot);
    ``copy_kept``: marked so that its task's start forgets the copy kept of it
    (`forget_moved_copy()`)."""
    headers = dict(message.headers or {})
    if handover is not None:
        headers = with_handover(headers, semaphore, handover.token, moved=copy_kept)
        if handover.delay > 0:  # Celery's message protocol 2 carries the ETA in its headers
            eta = datetime.now(timezone.utc) + timedelta(seconds=handover.delay)
            headers["eta"] = eta.isoformat()
    queue = app.amqp.queues[handover_queue(home)]
    properties = {k: v for k, v in (message.properties or {}).items() if k in KEPT_PROPERTIES}
    Producer(channel).publish(
        message.body, exchange="", routing_key=queue.name, declare=[queue], headers=headers,
        content_type=message.content_type, content_encoding=message.content_encoding,
        **properties,
    )  # fmt: skip
