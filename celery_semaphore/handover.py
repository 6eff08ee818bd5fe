"""Parked tasks: their messages kept beside their places in line, published when due.

A task refused a permit away from the head of the line does not go back to the
broker as a countdown retry: `celery_semaphore.admission` parks it, keeping what Celery
needs to publish it again (the retry's signature, serialized with the app's
``task_serializer``) in the semaphore's Redis, and the execution ends as a
Celery retry that publishes nothing. When permits free up, the script that
frees them selects the parked tasks now due, in ticket order, and the calling
process publishes them here (`publisher()`). Each published copy carries
its handover token in the ``celery_semaphore`` header; an older copy that
arrives later is dropped at admission (``StaleHandover``)::

    refused, position 40 -> park(payload)  -> Retry (RETRY in Flower, nothing published)
    ... a holder releases -> release.lua hands over the next ones -> publish(payload + token)
    arrives -> attempt(handover=token) -> granted, or waits in place (its turn is near)

A new task whose place in line is far back is parked at publish instead
(`celery_semaphore.publish`): the payload is then the message the producer was about to
send (`encode_message()`), published as it was, to the handover queue,
when its turn comes. It never reaches a worker before then, so a long
backlog costs the workers nothing.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from celery.canvas import Signature
from kombu.serialization import dumps, loads, prepare_accept_content
from kombu.utils import json as kombu_json

from .core import Handover
from .gates import HANDOVER_SUFFIX, WAIT_HEADER

logger = logging.getLogger(__name__)

HANDOVER_KEY = "handover"  # in the celery_semaphore header: [semaphore name, token]
# ``producer.publish`` keywords a parked message does not keep: how to send it
# (the publisher of the handover decides), and how its body was serialized
# (kept with the body).
NOT_KEPT = frozenset({
    "retry", "retry_policy", "declare", "timeout", "confirm_timeout", "serializer",
    "content_type", "content_encoding",
})  # fmt: skip


class TooLarge(ValueError):
    """The task's message is larger than ``semaphore_park_max_bytes``."""


def _pack(content_type: str, encoding: str, body: str | bytes) -> list[str]:
    if isinstance(body, bytes):
        return [content_type, encoding, "base64", base64.b64encode(body).decode("ascii")]
    return [content_type, encoding, "text", body]


def _unpack(content_type: str, encoding: str, body_encoding: str, body: str) -> str | bytes:
    return base64.b64decode(body) if body_encoding == "base64" else body


def _checked(payload: str, max_bytes: int) -> str:
    if len(payload) > max_bytes:
        raise TooLarge(f"the task's message is {len(payload)} bytes, over {max_bytes}")
    return payload


def encode(app: Any, signature: Signature, max_bytes: int) -> str:
    """``signature`` as a payload to park (raises TooLarge, or the serializer's error)."""
    packed = _pack(*dumps(dict(signature), serializer=app.conf.task_serializer))  # type: ignore[no-untyped-call]
    return _checked(json.dumps(packed), max_bytes)


def encode_message(
    app: Any, body: Any, publish: dict[str, Any], queue: str | None, max_bytes: int
) -> str:
    """A message a producer was about to publish (``producer.publish(body, **publish)``)
    as a payload to park, with ``queue``, the queue it was sent to. The body is
    serialized now, as the producer would have; the rest must be JSON (Celery's
    headers and properties are; anything else raises TypeError)."""
    serializer = publish.get("serializer") or app.conf.task_serializer
    packed = _pack(*dumps(body, serializer=serializer))  # type: ignore[no-untyped-call]
    options = {k: v for k, v in publish.items() if k not in NOT_KEPT and v is not None}
    envelope = {"message": packed, "queue": queue, "options": options}
    return _checked(kombu_json.dumps(envelope), max_bytes)  # type: ignore[no-untyped-call]


def decode(app: Any, payload: str) -> Signature:
    """The signature `encode()` parked."""
    return _signature(app, json.loads(payload))


def _signature(app: Any, packed: list[str]) -> Signature:
    return Signature.from_dict(_loads(app, *packed), app=app)


def _loads(app: Any, content_type: str, encoding: str, body_encoding: str, body: str) -> Any:
    data = _unpack(content_type, encoding, body_encoding, body)
    accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]
    return loads(data, content_type, encoding, accept=accept)  # type: ignore[no-untyped-call]


def _marked(headers: dict[str, Any] | None, semaphore: str, token: int) -> dict[str, Any]:
    """``headers`` with the handover token in the ``celery_semaphore`` header."""
    headers = dict(headers or {})
    state = dict(headers.get(WAIT_HEADER) or {})
    state[HANDOVER_KEY] = [semaphore, token]
    headers[WAIT_HEADER] = state
    return headers


def publish(app: Any, semaphore: str, handover: Handover) -> None:
    """Publish one handed-over task, marked with its handover token."""
    parked = kombu_json.loads(handover.payload)  # type: ignore[no-untyped-call]
    if isinstance(parked, dict):
        _publish_message(app, semaphore, handover.token, parked)
        return
    signature = _signature(app, parked)
    options = signature.options
    options["headers"] = _marked(options.get("headers"), semaphore, handover.token)
    signature.apply_async()


def _publish_message(app: Any, semaphore: str, token: int, parked: dict[str, Any]) -> None:
    """Publish a message parked at publish time to its queue's handover queue (or,
    where its queue was not known, as it was addressed)."""
    content_type, encoding, body_encoding, body = parked["message"]
    options = dict(parked["options"])
    options["headers"] = _marked(options.get("headers"), semaphore, token)
    if parked["queue"]:
        queue = app.amqp.queues[parked["queue"] + HANDOVER_SUFFIX]
        options.update(exchange="", routing_key=queue.name, declare=[queue])
    with app.producer_or_acquire() as producer:
        producer.publish(
            _unpack(content_type, encoding, body_encoding, body),
            content_type=content_type,
            content_encoding=encoding,
            retry=True,
            retry_policy=app.conf.task_publish_retry_policy,
            **options,
        )


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
