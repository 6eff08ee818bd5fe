"""Waiting for a wake-up: how long a waiter sleeps unless its store wakes it
(`AsyncStore.wait_for_wakeup`; the Redis store's messages are read in
`celery_semaphore.core.redis.wake_messages`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .results import Place

if TYPE_CHECKING:
    from .protocol import SemaphoreSpec


def pause(spec: SemaphoreSpec, place: Place, remaining: float | None) -> float:
    """How long a blocked waiter sleeps unless woken: never past the earliest
    holder's lease end (whose reclaim may admit it) nor a third of its waiter lease."""
    pause = min(spec.recheck_interval, spec.waiter_lease / 3)
    if place.next_expiry_in is not None:
        pause = min(pause, place.next_expiry_in + 0.002)
    if place.resumes_in is not None:
        pause = min(pause, place.resumes_in + 0.002)
    if place.rate_due is not None and place.rate_due > 0:
        pause = min(pause, place.rate_due + 0.001)
    if remaining is not None:
        pause = min(pause, remaining)
    return max(pause, 0.001)
