"""What a semaphore asks of its store: one typed request per operation.

A request is validated and resolved against the semaphore's settings
(`celery_semaphore.core.protocol.SemaphoreSpec` builds them) before any store sees it,
so every store gets the same checked values: times in ms, an `Ask` resolved into
`Asked` (its permits, grants, priority, fair key and that key's weight). A store
(`celery_semaphore.core._async.store`) turns them into its own calls: the Redis store
into script arguments (`celery_semaphore.core.redis.arguments`), the memory store into
calls of the reference model (`celery_semaphore.core.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_semaphore.core.model.order import PLAIN_ASKED, Asked

__all__ = [
    "PLAIN_ASKED",
    "Acquire",
    "AcquireAll",
    "Asked",
    "Claim",
    "Configure",
    "Enqueue",
    "Park",
    "ParkWhenFar",
    "Release",
    "Renew",
]


@dataclass(frozen=True, slots=True)
class Acquire:
    """Take a permit, or take or keep a place in line (`AsyncSemaphore.attempt`).
    ``wait_ms`` 0: a refused contender keeps no place; ``handover``: the token of the
    handed-over copy this is; ``in_place``: the contender listens for a direct grant."""

    holder: str
    ticket: int | None
    wait_ms: int
    lease_ms: int
    info: str
    handover: int | None = None
    in_place: bool = False
    ask: Asked = PLAIN_ASKED


@dataclass(frozen=True, slots=True)
class AcquireAll:
    """A permit of every semaphore of a set, or none (`AsyncSemaphoreSet.attempt`):
    per semaphore, in the set's order, ``wait_ms``, ``lease_ms`` and ``asks``;
    ``hold_ms``: how long it keeps its places where it was not refused; ``came_by``:
    (index of the semaphore that handed it over, that `Handover`'s token) or None."""

    holder: str
    ticket: int | None
    hold_ms: int
    info: str
    wait_ms: tuple[int, ...]
    lease_ms: tuple[int, ...]
    asks: tuple[Asked, ...]
    came_by: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Park:
    """Stay in line without asking, leaving ``payload`` to be handed over when due
    (`AsyncSemaphore.park`); ``due_ms`` 0: no due time; ``ask`` None: as recorded."""

    holder: str
    ticket: int | None
    payload: str
    park_ms: int
    info: str
    due_ms: int = 0
    ask: Asked | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """Whose turn the message ``taken`` from a parking queue gets, for the holder of the
    handover of ``handed`` with ``token`` (`AsyncSemaphore.claim`)."""

    taken: str
    handed: str
    token: int


@dataclass(frozen=True, slots=True)
class ParkWhenFar:
    """What `Enqueue` adds to park the waiter at once when its turn is far
    (`AsyncSemaphore.take_place_or_park`): ``head`` + its ticket + ``tail`` is parked."""

    window_us: int
    head: str
    tail: str
    park_ms: int
    due_ms: int = 0


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Take a place in line without asking for a permit (`AsyncSemaphore.take_place`),
    and park there when the turn is far if ``far`` says how."""

    holder: str
    wait_ms: int
    info: str
    ask: Asked = PLAIN_ASKED
    far: ParkWhenFar | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """Give a permit back (``token`` None: whatever ``holder`` holds, and its place);
    ``unused``: the rate's grants to give back with a permit its task never used;
    ``keep_as``: keep it as that holder where nobody waits (`SemaphoreModel.keep`),
    ``keep_info`` beside it."""

    holder: str
    token: int | None = None
    unused: int = 0
    keep_as: str = ""
    keep_info: str = ""


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend leases by ``lease_ms``: ``held`` lists (holder, fencing token or None,
    permits held or None: as recorded)."""

    held: tuple[tuple[str, int | None, int | None], ...]
    lease_ms: int


@dataclass(frozen=True, slots=True)
class Configure:
    """Set a runtime setting for every client: ``field`` is one of "override",
    "rate_override", "rate_pause", "draining"; ``value`` its text ('' clears it)."""

    field: str
    value: str
