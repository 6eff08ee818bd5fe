"""What the wake channel says (a waiter in place listens on its semaphore's
``SemaphoreKeys.channel``): a release publishes either the highest ticket now
admissible (every waiter up to it asks again) or
``g|<holder>|<token>|<expires ms>|<waited ms>``: a permit granted straight to that
waiter (grant_in_place() in common_after_free.lua); a new line publishes ``k``
(stand_in_line() in common_line.lua): it admits nobody, and tells the processes that
keep permits to give them back.
"""

from __future__ import annotations

from typing import Any

from celery_semaphore.core.results import Grant

from .replies import text

GRANT_PREFIX = "g|"  # a wake-up message that grants a waiter in place its permit
RECALL = "k"  # the first waiter joined an empty line: kept permits go back


def admits(message: Any, ticket: int) -> bool:
    """Whether a wake-up ``message`` (the highest ticket now admissible) can admit
    ``ticket``; a waiter with no ticket, or an unreadable message, tries anyway.
    A grant (`grant_in()`) admits nobody else."""
    data = text(message.get("data", "")) if isinstance(message, dict) else ""
    if data.startswith(GRANT_PREFIX) or data == RECALL:
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
