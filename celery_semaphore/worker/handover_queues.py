"""Consumer step: where any task waits in handover mode, consume each queue's handover queue too.

A task handed over when its turn comes is published to its queue's handover
queue (``formats.handover_queue()``) rather than to ``<queue>``: behind a backlog
of thousands of new messages in ``<queue>``, the next owner of a freed permit
would arrive seconds late. The workers that consume ``<queue>`` consume its
handover queue as well (added here when the consumer starts, and again after a
reconnect).
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from celery_semaphore.config import uses_handover
from celery_semaphore.formats import handover_queue, is_handover_queue


class HandoverQueues(bootsteps.StartStopStep):  # type: ignore[misc]
    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "celery-semaphore handover queues"

    def start(self, consumer: Any) -> None:
        if not uses_handover(consumer.app):
            return
        for queue in list(consumer.task_consumer.queues):
            if not is_handover_queue(queue.name):
                consumer.add_task_queue(handover_queue(queue.name))
