"""What a semaphore may ask of the PostgreSQL store today, and the error for the rest.

The store does the semantics of the reference model for: limits, rates (GCRA), shadow
limits, fair share, FIFO tickets, priority, weights, several semaphores in one step,
leases on the database's clock, fencing tokens, waiting in place (LISTEN/NOTIFY),
places taken at publish, drain and the runtime override, status. The rest, parking
and hand-over (``park()``, ``claim()``, ``dispatch()``, ``take_place_or_park()``, a
handed-over copy), is refused by name when asked, before anything is written:
`NotOnThisStore`, which the conformance suite reports as a skip. (A semaphore made with
``on_handover`` works: nothing is handed over where nothing parks.)
"""

from __future__ import annotations

from celery_semaphore.core.errors import NotOnThisStore

INSTEAD = "keep this semaphore on Redis (a redis:// URL) for now"


def refuse(what: str) -> NotOnThisStore:
    return NotOnThisStore("PostgreSQL", what, INSTEAD)
