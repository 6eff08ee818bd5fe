"""Signals this package sends, for users and for the metrics module.

Connect like any Celery signal:

    from celery_semaphore.signals import permit_lost

    @permit_lost.connect
    def page_someone(sender, semaphore, task_id, **kwargs): ...
"""

from celery.utils.dispatch import Signal

permit_lost = Signal(name="semaphore_permit_lost")
"""A running task's permit was found lost by the worker's heartbeat (its lease
ran out or Redis lost its data). The task keeps running; it no longer counts
against the limit. Sent in the worker's main process. Arguments: ``semaphore``
(name), ``task_id``, ``task_name``, ``hostname``."""

permit_waiting = Signal(name="semaphore_permit_waiting")
"""A task was refused a permit and will ask again. Sent in the process that
asked. Arguments: ``semaphore``, ``task_id``, ``task_name``, ``position``,
``countdown`` (seconds until it asks again; None when it parked and waits to be
handed over)."""

permit_granted = Signal(name="semaphore_permit_granted")
"""A task was granted a permit. Arguments: ``semaphore``, ``task_id``,
``task_name``, ``waited`` (seconds since the task's first attempt in this wait
period)."""

data_lost = Signal(name="semaphore_data_lost")
"""The semaphores' Redis lost its data (see the guarantees page), as the worker's
heartbeat found: sent once per loss by each worker that noticed it, in its main
process, after its renewals wrote back the permits of its running tasks. Sender:
the app. Arguments: ``url`` (password masked), ``hostname``, ``restored`` (permits
this worker wrote back), ``paused_for`` (seconds no permit is granted from when a
client noticed; 0 if none had seen the data), ``resumes_at`` (server time),
``parked_lost`` (names of the semaphores whose parked tasks were lost with it)."""

permit_released = Signal(name="semaphore_permit_released")
"""A task gave a permit back. Arguments: ``semaphore``, ``task_id``,
``task_name``, ``released`` (False if it was already lost)."""

rate_limited = Signal(name="semaphore_rate_limited")
"""A task body raised `RateLimited`: the rate of ``semaphore`` starts no task for
``retry_after`` seconds (from the raise, on the Redis server's clock), and the task
goes back to the head of the line. Sent in the process that ran the body, once per
semaphore paused. Arguments: ``semaphore``, ``task_id``, ``task_name``, ``retry_after``."""

shadow_refused = Signal(name="semaphore_shadow_refused")
"""A task was granted a permit that a shadow limit of its semaphore (``shadow=True``)
would have refused, had it been enforced. Sent in the process that asked.
Arguments: ``semaphore``, ``task_id``, ``task_name``, ``limits`` (``["limit"]``,
``["rate"]`` or both), ``would_wait`` (seconds the shadow rate would have delayed it;
0 for a shadow limit alone: how long is not known)."""
