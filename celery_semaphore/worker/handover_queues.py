"""Consumer step: where any task waits in handover mode, consume each queue's handover queue too.

A task handed over when its turn comes is published to its queue's handover
queue (``formats.handover_queue()``) rather than to ``<queue>``: behind a backlog
of thousands of new messages in ``<queue>``, the next owner of a freed permit
would arrive seconds late. The workers that consume ``<queue>`` consume its
handover queue as well (added here when the consumer starts, and again after a
reconnect). The queue is only added: the worker's event loop starts consuming once
it can take messages (``Consumer.add_task_queue()`` would start at once, and on
RabbitMQ a message already waiting would arrive before the worker has a callback
for it: the consumer crashed with "Consumer does not have any callbacks").

It is added after Celery's native delayed delivery step (Celery 5.5+, started where
a queue is a quorum queue), which binds every queue the app knows to its delay
exchanges and warns about each one on a direct exchange: a handover queue known by
then was warned about at some starts of a worker, as the steps' order fell
("Exchange <its name> is a direct exchange and native delayed delivery do not
support direct exchanges"); after a reconnect the app knows it, and
that step warns once more. No handover is sent as a native delayed message.
"""

from __future__ import annotations

from typing import Any

from celery import VERSION, bootsteps

from celery_semaphore.config import uses_handover
from celery_semaphore.formats import handover_queue, is_handover_queue


class HandoverQueues(bootsteps.StartStopStep):  # type: ignore[misc]
    requires: tuple[str, ...] = ("celery.worker.consumer.tasks:Tasks",)
    if VERSION >= (5, 5):
        requires += ("celery.worker.consumer.delayed_delivery:DelayedDelivery",)
    label = "celery-semaphore handover queues"

    def start(self, consumer: Any) -> None:
        if not uses_handover(consumer.app):
            return
        queues, tasks = consumer.app.amqp.queues, consumer.task_consumer
        for queue in list(tasks.queues):
            name = handover_queue(queue.name)
            if is_handover_queue(queue.name) or tasks.consuming_from(name):
                continue
            # indexing makes a missing queue (task_create_missing_queues), as Celery's own
            tasks.add_queue(queues.select_add(queues[name]))
