"""Deciding a request's gates in the worker's main process, when its message arrives.

The decision (`celery_semaphore.gates.request_gates()`) is stored in the
request's headers, so the child that runs the body, the heartbeat and the
release-by-id handlers all agree on the same gates.
"""

from __future__ import annotations

from typing import Any

from celery_semaphore.config import task_config
from celery_semaphore.formats import GATES_HEADER, QUEUE_HEADER, base_queue, encode_gates
from celery_semaphore.gates import queue_of, request_gates
from celery_semaphore.state import state_of
from celery_semaphore.worker.kept_of_children import note_gate


def consumed_queue(consumer: Any, delivery_info: dict[str, Any]) -> str | None:
    """The queue this worker consumed the message from (the Redis transport does
    not record it: resolved from the exchange and routing key); for a handed-over
    task, the queue its handover queue serves."""
    queues = getattr(getattr(consumer, "task_consumer", None), "queues", None) or ()
    exchange, routing_key = delivery_info.get("exchange"), delivery_info.get("routing_key")
    return base_queue(queue_of(queues, exchange, routing_key))


def keeps(task: Any) -> bool:
    """Whether this worker's processes may keep permits of ``task``'s requests."""
    return state_of(task.app).keeps_permits and task_config(task).keep_idle > 0


def decide_gates(sender: Any = None, request: Any = None, **_: Any) -> None:
    """``task_received`` handler (``sender`` is the consumer)."""
    delivery_info = request.delivery_info or {}
    queue = consumed_queue(sender, delivery_info)
    if queue is not None:
        request.request_dict[QUEUE_HEADER] = queue
    priority = delivery_info.get("priority")
    try:
        gates = request_gates(request.task, request.args, request.kwargs, queue, priority)
    except (TypeError, ValueError):
        gates = []  # the child computes them again and fails the task with the message
    if gates:
        request.request_dict[GATES_HEADER] = encode_gates(gates)
        if len(gates) == 1 and keeps(request.task):
            note_gate(request.task.app, gates[0])
    else:
        request.request_dict.pop(GATES_HEADER, None)
