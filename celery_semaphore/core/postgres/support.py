"""What a semaphore may ask of the PostgreSQL store today, and the error for the rest.

The store does the semantics of the reference model for: limits, rates (GCRA), shadow
limits, fair share, FIFO tickets, priority, weights, several semaphores in one step,
leases on the database's clock, fencing tokens, waiting in place (LISTEN/NOTIFY),
places taken at publish, drain and the runtime override, status. The rest (parking
and hand-over) is refused by name when the semaphore is made, so a semaphore never runs
with half its settings: `NotOnThisStore`, which the conformance suite reports as a skip.
"""

from __future__ import annotations

from celery_semaphore.core.errors import NotOnThisStore
from celery_semaphore.core.model.order import Asked
from celery_semaphore.core.protocol import SemaphoreSpec

INSTEAD = "keep this semaphore on Redis (a redis:// URL) for now"


def check(spec: SemaphoreSpec, ask: Asked | None = None) -> None:
    """Raise `NotOnThisStore` if ``spec`` (or ``ask``) needs what is not done here."""
    what = None
    if spec.dispatch is not None:
        what = "parking and hand-over (on_handover=)"
    if what is not None:
        raise NotOnThisStore("PostgreSQL", what, INSTEAD)


def refuse(what: str) -> NotOnThisStore:
    return NotOnThisStore("PostgreSQL", what, INSTEAD)
