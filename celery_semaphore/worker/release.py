"""Release by task id, for the endings only the worker's main process hears of.

- revoke (before start, or ``terminate=True`` while running): ``task_revoked``;
- a child killed (SIGKILL, OOM) or a hard time limit: ``task_failure`` with
  ``WorkerLostError`` / ``TimeLimitExceeded`` (the hard limit reports twice);
- cold shutdown: ``task_retry`` without ``einfo``.

Every path is idempotent: releasing what is already free does nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import state as worker_state

from celery_semaphore import signals
from celery_semaphore.config import get_config, task_config
from celery_semaphore.core.errors import SemaphoreError
from celery_semaphore.core.validation import MAX_LIMIT
from celery_semaphore.formats import Gate, WaitState, recorded_gates
from celery_semaphore.gates import QUEUE_PREFIX, semaphore_of

logger = logging.getLogger(__name__)


def release_by_id(task: Any, task_id: str, gates: list[Gate]) -> None:
    if not gates or task is None:
        return
    config = task_config(task)
    for gate in gates:
        try:
            released = semaphore_of(task.app, gate, config).release(task_id)
        except SemaphoreError as error:
            logger.warning(
                "could not release %s of %s (lease runs out): %s", gate.name, task_id, error
            )
            continue
        if released:
            signals.permit_released.send(
                sender=task,
                semaphore=gate.name,
                task_id=task_id,
                task_name=task.name,
                released=True,
            )


def on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """``task_revoked`` handler."""
    if request is not None:
        gates = recorded_gates(request) or _gates_waited_for(sender, request)
        release_by_id(sender, request.id, gates)


def _gates_waited_for(task: Any, request: Any) -> list[Gate]:
    """The gates where a request that never reached ``task_received`` holds a place in line.

    Celery discards a message of a task already known to be revoked before it
    sends ``task_received`` (so before the gates are decided). The places the
    task took (at publish, or while waiting) are named by the tickets it
    carries; drop them now rather than let them block the line until they lapse.
    """
    if task is None:
        return []
    tickets = WaitState.of(request).tickets
    if not tickets:
        return []
    config = get_config(task.app)
    declared = {d.name: d.limit for d in getattr(task, "declared_limits", None) or ()}
    gates = []
    for name in tickets:
        if name.startswith(QUEUE_PREFIX):
            queue = name[len(QUEUE_PREFIX) :]
            limit = config.queue_limits.get(queue)
            if limit is None and queue in config.queue_rates:
                limit = MAX_LIMIT  # a rate alone caps no concurrency
        elif name in declared:
            limit = MAX_LIMIT if declared[name] is None else declared[name]
        else:  # a key function's semaphore
            limit = getattr(task, "limit", None)
        gates.append(Gate(name, limit if isinstance(limit, int) and limit > 0 else 1))
    return gates


def on_failure(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    """``task_failure`` handler: a killed child or a hard time limit (in the main
    process), or an ordinary failure (in the child, which released already)."""
    if sender is None or not task_id:
        return
    gates = _active_gates(task_id)
    request = getattr(sender, "request", None)
    if not gates and request is not None and request.id == task_id:
        gates = recorded_gates(request)  # in the process that ran the body
    release_by_id(sender, task_id, gates)


def on_cold_shutdown(sender: Any = None, request: Any = None, einfo: Any = None, **_: Any) -> None:
    """``task_retry`` handler: only cold shutdown sends a retry without ``einfo``."""
    if einfo is None and request is not None:
        release_by_id(sender, request.id, recorded_gates(request))


def _active_gates(task_id: str) -> list[Gate]:
    for request in list(worker_state.active_requests):
        if request.id == task_id:
            return recorded_gates(request)
    return []
