"""Places in line taken when a limited task is published, so FIFO follows submission order.

Without this, a task's place in line would date from its first attempt in a
worker, and tasks submitted together would be ordered by which worker process
happened to pick them first. The place holds for a few seconds; a task that
reaches a worker later still presents its ticket and regains its place.

Publishing never stalls on the semaphore's Redis: the call gives up within
:data:`~.gates.QUICK_TIMEOUT`, and after a failure no places are taken for a
few seconds (tasks then take their place at their first attempt, as a task
with an ETA always does).
"""

from __future__ import annotations

import logging
import time
from typing import Any
from weakref import WeakSet

from celery.signals import before_task_publish

from .config import get_config
from .errors import SemaphoreError
from .gates import WAIT_HEADER, queue_gate, semaphores, task_gate

logger = logging.getLogger(__name__)

PLACE_AT_PUBLISH = 5.0
PAUSE_AFTER_ERROR = 5.0

installed_apps: WeakSet[Any] = WeakSet()
_paused_until = [0.0]


def _take_places(
    sender: Any = None,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    routing_key: Any = None,
    **_: Any,
) -> None:
    if not headers or headers.get("eta") or headers.get("retries") or WAIT_HEADER in headers:
        return
    if time.monotonic() < _paused_until[0] or not isinstance(body, tuple | list) or len(body) < 2:
        return
    for app in list(installed_apps):
        task = app.tasks.get(sender)
        if task is None:
            continue
        config = get_config(app)
        try:
            gates = [queue_gate(routing_key, config), task_gate(task, body[0], body[1])]
            tickets = {
                gate.name: semaphores.get(gate, config, quick=True).enqueue(
                    headers["id"], wait_lease=PLACE_AT_PUBLISH, info=sender
                )
                for gate in gates
                if gate is not None
            }
        except (TypeError, ValueError):
            return  # a bad key function fails the task in the worker, with a clear message
        except SemaphoreError as error:
            _paused_until[0] = time.monotonic() + PAUSE_AFTER_ERROR
            logger.warning("no place in line taken at publish: %s", error)
            return
        if tickets:
            headers[WAIT_HEADER] = {"tickets": tickets, "waits": 0, "first_ask": None}
        return


before_task_publish.connect(_take_places, weak=False)
