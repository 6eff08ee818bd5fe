"""Consumer step: in handover mode, consume each queue's handover queue too.

A task handed over when its turn comes is published to ``<queue>.semaphore-handover``
rather than to ``<queue>``: behind a backlog of thousands of new messages in
``<queue>``, the next owner of a freed permit would arrive seconds late. The
workers that consume ``<queue>`` consume its handover queue as well (added here
when the consumer starts, and again after a reconnect).
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from celery_semaphore.config import get_config
from celery_semaphore.gates import HANDOVER_SUFFIX


class HandoverQueues(bootsteps.StartStopStep):  # type: ignore[misc]
    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "celery-semaphore handover queues"

    def start(self, consumer: Any) -> None:
        if get_config(consumer.app).wait_mode != "handover":
            return
        for queue in list(consumer.task_consumer.queues):
            if not queue.name.endswith(HANDOVER_SUFFIX):
                consumer.add_task_queue(queue.name + HANDOVER_SUFFIX)
