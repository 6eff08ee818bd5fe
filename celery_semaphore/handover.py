"""Parked tasks: their messages kept beside their places in line, published when due.

A task refused a permit away from the head of the line does not go back to the
broker as a countdown retry: :mod:`.admission` parks it, keeping what Celery
needs to publish it again (the retry's signature, serialized with the app's
``task_serializer``) in the semaphore's Redis, and the execution ends as a
Celery retry that publishes nothing. When permits free up, the script that
frees them selects the parked tasks now due, in ticket order, and the calling
process publishes them here (:func:`publisher`). Each published copy carries
its handover token in the ``celery_semaphore`` header; an older copy that
arrives later is dropped at admission (``StaleHandover``)::

    refused, position 40 -> park(payload)  -> Retry (RETRY in Flower, nothing published)
    ... a holder releases -> release.lua hands over the next ones -> publish(payload + token)
    arrives -> attempt(handover=token) -> granted, or waits in place (its turn is near)
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from celery.canvas import Signature
from kombu.serialization import dumps, loads, prepare_accept_content

from .core import Handover
from .gates import WAIT_HEADER

logger = logging.getLogger(__name__)

HANDOVER_KEY = "handover"  # in the celery_semaphore header: [semaphore name, token]


class TooLarge(ValueError):
    """The task's message is larger than ``semaphore_park_max_bytes``."""


def encode(app: Any, signature: Signature, max_bytes: int) -> str:
    """``signature`` as a payload to park (raises TooLarge, or the serializer's error)."""
    content_type, encoding, body = dumps(  # type: ignore[no-untyped-call]
        dict(signature), serializer=app.conf.task_serializer
    )
    if isinstance(body, bytes):
        body, body_encoding = base64.b64encode(body).decode("ascii"), "base64"
    else:
        body_encoding = "text"
    payload = json.dumps([content_type, encoding, body_encoding, body])
    if len(payload) > max_bytes:
        raise TooLarge(f"the task's message is {len(payload)} bytes, over {max_bytes}")
    return payload


def decode(app: Any, payload: str) -> Signature:
    content_type, encoding, body_encoding, body = json.loads(payload)
    data = base64.b64decode(body) if body_encoding == "base64" else body
    accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]
    fields = loads(data, content_type, encoding, accept=accept)  # type: ignore[no-untyped-call]
    return Signature.from_dict(fields, app=app)


def publish(app: Any, semaphore: str, handover: Handover) -> None:
    """Publish one handed-over task, marked with its handover token."""
    signature = decode(app, handover.payload)
    options = signature.options
    headers = dict(options.get("headers") or {})
    state = dict(headers.get(WAIT_HEADER) or {})
    state[HANDOVER_KEY] = [semaphore, handover.token]
    headers[WAIT_HEADER] = state
    options["headers"] = headers
    signature.apply_async()


def publisher(app: Any, semaphore: str) -> Callable[[list[Handover]], None]:
    """The ``on_handover`` of ``semaphore``'s client in this process. A failed
    publish is logged: the handover's deadline brings the task back (any worker's
    heartbeat publishes it again)."""

    def publish_all(handovers: list[Handover]) -> None:
        for handover in handovers:
            try:
                publish(app, semaphore, handover)
            except Exception as error:  # the deadline is the backstop
                logger.warning(
                    "could not publish %s (handed over by semaphore %s); it is published "
                    "again after semaphore_handover_deadline: %r",
                    handover.holder,
                    semaphore,
                    error,
                )

    return publish_all
