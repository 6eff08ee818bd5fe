"""Waiting for a wake-up: how long a waiter sleeps, and what the wake channel says.

A waiter in place listens on its semaphore's channel (``SemaphoreKeys.channel``).
A release publishes either the highest ticket now admissible (every waiter up to it
asks again) or ``g|<holder>|<token>|<expires ms>|<waited ms>``: a permit granted
straight to that waiter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .replies import text
from .results import Grant, Place

if TYPE_CHECKING:
    from .protocol import SemaphoreSpec

GRANT_PREFIX = "g|"  # a wake-up message that grants a waiter in place its permit


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


def admits(message: Any, ticket: int) -> bool:
    """Whether a wake-up ``message`` (the highest ticket now admissible) can admit
    ``ticket``; a waiter with no ticket, or an unreadable message, tries anyway.
    A grant (`grant_in()`) admits nobody else."""
    data = text(message.get("data", "")) if isinstance(message, dict) else ""
    if data.startswith(GRANT_PREFIX):
        return False
    try:
        bound = float(data)
    except ValueError:
        return True
    return not ticket or ticket <= bound


def grant_in(message: Any, holder: str) -> Grant | None:
    """The permit a wake-up ``message`` grants ``holder`` (a release handed it
    over to this waiter in place), else None."""
    data = text(message.get("data", "")) if isinstance(message, dict) else ""
    if not data.startswith(GRANT_PREFIX):
        return None
    granted, token, expires, waited = data[len(GRANT_PREFIX) :].rsplit("|", 3)
    if granted != holder:
        return None
    return Grant(int(token), int(expires) / 1000, int(waited) / 1000)
