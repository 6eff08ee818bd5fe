"""What a worker does after the semaphores' Redis lost its data.

The heartbeat's renewals write the permits of the running tasks back while
admissions are paused (`celery_semaphore.core.redis.epochs`, renew.lua). `WrittenBack`
remembers them and gives back those whose tasks ended meanwhile; `report_loss()`
says what happened: a WARNING, the `celery_semaphore.signals.data_lost` signal
(and its ``semaphore-data-lost`` event), and an ERROR where tasks were parked in
that Redis: they are lost. Tasks parked in the broker's parking queues (RabbitMQ, a
Redis broker on another server) lose nothing and get their places back
(`celery_semaphore.worker.parked_rebuild`). Tasks park in the semaphores' Redis only
where it is the broker's own server (a restart without persistence takes the
broker's queued messages too) or, on other brokers, where it appends every write
(then it was flushed, or failed over to a replica without them):
`celery_semaphore.durability`.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from celery_semaphore import signals
from celery_semaphore.config import get_config
from celery_semaphore.core import Permit
from celery_semaphore.core.errors import SemaphoreError
from celery_semaphore.core.results import DataLoss
from celery_semaphore.core.urls import mask_url
from celery_semaphore.formats import Gate
from celery_semaphore.gates import semaphore_of

logger = logging.getLogger(__name__)

WRITTEN_BACK_TOKEN = 0  # the fencing token of a permit written back by task id (renew.lua)


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S.%f")[:-3]


class WrittenBack:
    """Requests whose permits a renewal wrote back, by gate, until they end."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._ids: defaultdict[Gate, set[str]] = defaultdict(set)

    def add(self, gate: Gate, task_ids: Iterable[str]) -> None:
        self._ids[gate] |= set(task_ids)

    def release_ended(self, running: set[str]) -> None:
        """Permits written back for requests that have ended since: their own release
        came first (and found nothing) or will not come, so they go back now (the
        next beat comes soon after a write-back). Only the written-back entry (token
        0) goes: a new execution of the same task id that holds a permit keeps it."""
        for gate, ids in list(self._ids.items()):
            ended = ids - running
            if not ended:
                continue
            semaphore = semaphore_of(self.app, gate, get_config(self.app))
            for task_id in ended:
                with contextlib.suppress(SemaphoreError):
                    Permit(semaphore, task_id, WRITTEN_BACK_TOKEN, 0.0, 0.0).release()
            self._ids[gate] = ids & running
            if not self._ids[gate]:
                del self._ids[gate]


def report_loss(
    app: Any, hostname: str | None, loss: DataLoss, restored: int, parked_in: set[str]
) -> None:
    """The log line, signal and event of a data loss this process noticed."""
    parked_lost = sorted(parked_in)
    if loss.lost_at:
        paused = (
            f"no permit is granted until {_clock(loss.resumes_at)} "
            f"(a pause of {loss.pause:.1f} s from {_clock(loss.lost_at)}, when a client "
            "noticed the loss)"
        )
    else:
        paused = "admissions were not paused (no client that had seen the data noticed)"
    logger.warning(
        "Redis at %s lost its data; %s; this worker wrote back the permits of %d "
        "running limited task(s) (one that was still waiting for its permit gives "
        "back what it got at its next ask)",
        mask_url(loss.url),
        paused,
        restored,
    )
    if parked_lost:
        logger.error(
            "Redis at %s lost its data: the tasks parked there are lost (semaphores %s); "
            "they will not run: send them again. That Redis restarted without persistence "
            "(as the broker's own server, it lost the broker's queued messages too: give it "
            "appendonly yes), was flushed (FLUSHALL, FLUSHDB), or failed over to a replica "
            "that lacked them",
            mask_url(loss.url),
            ", ".join(parked_lost),
        )
    signals.data_lost.send(
        sender=app,
        url=mask_url(loss.url),
        hostname=hostname,
        restored=restored,
        paused_for=loss.pause,
        resumes_at=loss.resumes_at,
        parked_lost=parked_lost,
    )
