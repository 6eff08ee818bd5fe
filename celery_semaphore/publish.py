"""Places in line taken when a limited task is published, so FIFO follows submission order.

Without this, a task's place in line would date from its first attempt in a
worker, and tasks submitted together would be ordered by which worker process
happened to pick them first. The place holds for a few seconds; a task that
reaches a worker later still presents its ticket and regains its place.

Publishing never stalls on the semaphore's Redis: the call gives up within
:data:`~.state.QUICK_TIMEOUT`, and after a failure no places are taken for a
few seconds (tasks then take their place at their first attempt, as a task
with an ETA always does).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kombu.entity import Queue

from .config import get_config
from .core.errors import SemaphoreError
from .gates import WAIT_HEADER, queue_of, request_gates, semaphore_of
from .state import installed_apps, state_of

logger = logging.getLogger(__name__)

PLACE_AT_PUBLISH = 5.0
PAUSE_AFTER_ERROR = 5.0


def published_queue(app: Any, declare: Any, exchange: Any, routing_key: str | None) -> str | None:
    """The queue a message sent to ``exchange`` with ``routing_key`` lands in, resolved
    as the worker resolves it (``declare`` is not the answer: with an explicit exchange
    and routing key Celery still declares the task's routed queue)."""
    queues = [q for q in declare or () if isinstance(q, Queue)]
    return queue_of([*queues, *app.amqp.queues.values()], exchange, routing_key)


def take_places(
    sender: Any = None,
    *,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    exchange: Any = None,
    routing_key: Any = None,
    declare: Any = None,
    **_: Any,
) -> None:
    """``before_task_publish`` handler: a place in line per gate of a new task."""
    if not headers or headers.get("eta") or headers.get("retries") or WAIT_HEADER in headers:
        return
    if not isinstance(body, tuple | list) or len(body) < 2:
        return
    for app in list(installed_apps):
        # Every app of the process that knows the task name (Celery shares tasks
        # between apps) is asked in turn: the first whose settings give the task
        # gates takes its places.
        task = app.tasks.get(sender)
        if task is None:
            continue
        state = state_of(app)
        if time.monotonic() < state.publish_paused_until:
            continue
        config = get_config(app)
        try:
            queue = published_queue(app, declare, exchange, routing_key)
            tickets = {
                gate.name: semaphore_of(app, gate, config, quick=True).enqueue(
                    headers["id"], wait_lease=PLACE_AT_PUBLISH, info=sender
                )
                for gate in request_gates(task, body[0], body[1], queue)
            }
        except (TypeError, ValueError):
            continue  # a bad key function fails the task in the worker, with a clear message
        except SemaphoreError as error:
            state.publish_paused_until = time.monotonic() + PAUSE_AFTER_ERROR
            logger.warning("no place in line taken at publish: %s", error)
            continue
        if tickets:
            headers[WAIT_HEADER] = {"tickets": tickets, "waits": 0, "first_ask": None}
            return
