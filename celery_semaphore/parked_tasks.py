"""Parked tasks: their messages kept beside their places in line, published when due.

A task refused a permit away from the head of the line does not go back to the
broker as a countdown retry: it parks (`celery_semaphore.retry`), keeping what
Celery needs to publish it again (the retry's signature, serialized with the
app's ``task_serializer``: `celery_semaphore.formats`) in the semaphore's Redis,
and the execution ends as a Celery retry that publishes nothing. When permits
free up, the script that frees them selects the parked tasks now due, in
ticket order, and the calling process publishes them here (`Publisher`).
Each published copy carries its handover token in the ``celery_semaphore``
header; a copy that arrives after another one took the place is dropped at admission
(``StaleHandover``)::

    refused, position 40 -> park(payload)  -> Retry (RETRY in Flower, nothing published)
    ... a holder releases -> release.lua hands over the next ones -> publish(payload + token)
    arrives -> attempt(handover=token) -> granted, or waits in place (its turn is near)

A new task whose place in line is far back is parked at publish instead
(`celery_semaphore.publish`): the payload is then the message the producer was about to
send, published as it was, to the handover queue, when its turn comes. It
never reaches a worker before then, so a long backlog costs the workers nothing.

On an AMQP broker the message itself stays in the broker, in a parking queue, and
the payload says only where (`celery_semaphore.parking_queues`): the handover moves
the message from there.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from .core import Handover, Semaphore
from .formats import InBroker, ParkedMessage, decode_payload, handover_queue, with_handover
from .parking_queues import BrokerLink, deferred, move

logger = logging.getLogger(__name__)


def publish(app: Any, semaphore: Semaphore, handover: Handover, link: BrokerLink) -> None:
    """Publish one handed-over task, marked with its handover token; one handed over
    for a rate's slot (``handover.delay``) is due then (an ETA). One whose message
    waits in a parking queue is moved from there (by ``link``)."""
    parked = decode_payload(app, handover.payload)
    if isinstance(parked, InBroker):
        move(link, semaphore, handover, parked)
        return
    if isinstance(parked, ParkedMessage):
        _publish_message(app, semaphore, handover, parked)
        return
    options = parked.options
    options["headers"] = with_handover(options.get("headers"), semaphore.name, handover.token)
    if handover.delay > 0:
        options["countdown"] = handover.delay
    parked.apply_async()


def _publish_message(
    app: Any, semaphore: Semaphore, handover: Handover, parked: ParkedMessage
) -> None:
    """Publish a message parked at publish time to its queue's handover queue (or,
    where its queue was not known, as it was addressed)."""
    options = dict(parked.options)
    options["headers"] = with_handover(options.get("headers"), semaphore.name, handover.token)
    if handover.delay > 0:  # Celery's message protocol 2 carries the ETA in its headers
        eta = datetime.now(timezone.utc) + timedelta(seconds=handover.delay)
        options["headers"]["eta"] = eta.isoformat()
    if parked.queue:
        queue = app.amqp.queues[handover_queue(parked.queue)]
        options.update(exchange="", routing_key=queue.name, declare=[queue])
    with app.producer_or_acquire() as producer:
        producer.publish(
            parked.body,
            content_type=parked.content_type,
            content_encoding=parked.content_encoding,
            retry=True,
            retry_policy=app.conf.task_publish_retry_policy,
            **options,
        )


class Publisher:
    """The ``on_handover`` of a semaphore in this process (``semaphore``: set once the
    semaphore is made). A failed publish is logged: the handover's deadline brings
    the task back (any worker's heartbeat publishes it again)."""

    def __init__(self, app: Any, link: BrokerLink) -> None:
        self.app = app
        self.link = link
        self.semaphore: Semaphore | None = None

    def __call__(self, handovers: list[Handover]) -> None:
        semaphore = self.semaphore
        if semaphore is None:
            raise RuntimeError("a Publisher is called before its semaphore is set")
        for handover in handovers:
            if deferred(handover, functools.partial(self, [handover])):
                continue  # its message is on its way to its parking queue
            try:
                publish(self.app, semaphore, handover, self.link)
            except Exception as error:  # the deadline is the backstop
                logger.warning(
                    "could not publish %s (handed over by semaphore %s); it is published "
                    "again after semaphore_handover_deadline: %r",
                    handover.holder,
                    semaphore.name,
                    error,
                )
