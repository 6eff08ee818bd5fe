"""The seam where a store plugs in: what a semaphore asks of the place its state lives.

`AsyncSemaphore` and `AsyncSemaphoreSet` hold no state of their own and know no store:
they check their arguments (`celery_semaphore.core.protocol` makes the typed requests of
`celery_semaphore.core.requests`), call a store, and turn what it answers into permits,
places and handovers. Two stores implement this protocol:

- the Redis store (`celery_semaphore.core.redis._async.store`): scripts, one round trip
  per operation, shared by every process of a cluster;
- the memory store (`celery_semaphore.core.memory`): the reference model
  (`celery_semaphore.core.model`) in this process, for tests that need no server.

Every reply that hands over returns the handovers; the semaphore calls its
``on_handover`` with them. Places are as the store records them: the semaphore applies
its shadow limits (`SemaphoreSpec.binding`).

``core/_async/store.py`` is the source; ``core/_sync/store.py`` is generated from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from celery_semaphore.core.errors import SemaphoreConnectionError
from celery_semaphore.core.protocol import SemaphoreSpec
from celery_semaphore.core.requests import (
    Acquire,
    AcquireAll,
    Claim,
    Configure,
    Enqueue,
    Park,
    Release,
    Renew,
)
from celery_semaphore.core.results import (
    Claimed,
    Grant,
    Handover,
    Parked,
    Place,
    Places,
    SemaphoreStatus,
)


class AsyncStore(Protocol):
    """A store of semaphores (see the module docstring)."""

    #: Where the store is, for messages (a password masked).
    url: str

    async def acquire(
        self, spec: SemaphoreSpec, request: Acquire
    ) -> tuple[Grant | Place, list[Handover]]:
        """A permit, or a place in line (`StaleHandover` for a stale copy)."""
        ...

    async def acquire_all(
        self, specs: Sequence[SemaphoreSpec], request: AcquireAll
    ) -> tuple[list[Grant] | Places, list[list[Handover]]]:
        """A permit of every semaphore, or their places; handovers per semaphore."""
        ...

    def joint_problem(self, members: Sequence[tuple[Any, SemaphoreSpec]]) -> str | None:
        """Why these semaphores (``members``: each one's store and settings; the first
        of this store) cannot be taken in one step here, or None."""
        ...

    async def park(self, spec: SemaphoreSpec, request: Park) -> tuple[Parked, list[Handover]]:
        """Stay in line without asking; the payload is handed over when due."""
        ...

    async def claim(self, spec: SemaphoreSpec, request: Claim) -> Claimed:
        """Whose turn a message taken from a parking queue gets (a swap where it is
        another parked waiter's: `celery_semaphore.core.model.parking.Parking.claim`)."""
        ...

    async def list_parked(self, spec: SemaphoreSpec) -> None:
        """Make the semaphore findable by workers that hand over parked waiters (before
        its first park of a while)."""
        ...

    async def enqueue(
        self, spec: SemaphoreSpec, request: Enqueue
    ) -> tuple[Place, bool, list[Handover]]:
        """A place in line without asking; whether it parked (``request.far``)."""
        ...

    async def dispatch(self, spec: SemaphoreSpec, drop: tuple[str, ...]) -> list[Handover]:
        """Hand over what is due, after dropping ``drop`` if parked or handed over."""
        ...

    async def release(self, spec: SemaphoreSpec, request: Release) -> tuple[int, list[Handover]]:
        """Whether a permit was released (`constants.RELEASED`), kept (``keep_as``:
        `constants.KEPT`) or neither."""
        ...

    async def renew(
        self, spec: SemaphoreSpec, request: Renew
    ) -> tuple[float, set[str], list[Handover], int]:
        """The new lease end (s, the store's clock), the holders lost, the handovers, how
        many permits were written back after a data loss."""
        ...

    async def configure(
        self, spec: SemaphoreSpec, request: Configure
    ) -> tuple[str | None, list[Handover]]:
        """The setting's previous value (None: unset)."""
        ...

    async def status(self, spec: SemaphoreSpec) -> SemaphoreStatus:
        """What an operator sees (reads only)."""
        ...

    async def learn_epoch(self, spec: SemaphoreSpec) -> None:
        """Learn the store's data epoch now, so a later loss of its data is noticed."""
        ...

    async def note_lost(self, spec: SemaphoreSpec, count: int) -> None:
        """Count permits found lost (the ``permits_lost_total`` metric)."""
        ...

    async def listen(self, specs: Sequence[SemaphoreSpec]) -> Any:
        """Start listening for wake-ups of ``specs``: a subscription for `wait_for_wakeup`."""
        ...

    async def wait_for_wakeup(
        self, subscription: Any, ticket: int, holder: str, seconds: float
    ) -> Grant | None:
        """Sleep until a wake-up that may admit ``ticket`` (None), a permit granted to
        ``holder`` in place (the Grant), or ``seconds`` pass (None)."""
        ...

    async def wait_for_message(self, subscription: Any, seconds: float) -> str | None:
        """The wake channel (`wake_channel`) a message comes on within ``seconds``,
        `ANY_CHANNEL` if the store cannot tell which, None if none comes (a process that
        keeps permits of that semaphore gives them back: every message there means a
        line or a change, `celery_semaphore.kept_permits`)."""
        ...

    def wake_channel(self, spec: SemaphoreSpec) -> str:
        """The name of ``spec``'s wake channel, as `wait_for_message` tells it."""
        ...

    async def unlisten(self, subscription: Any, *, keep: bool) -> None:
        """Stop listening; ``keep``: the wait ended normally (the store may keep the
        connection for the next wait)."""
        ...

    def reconnectable(self, error: SemaphoreConnectionError) -> bool:
        """Whether the store may come back by itself (not a refused login)."""
        ...

    async def aclose(self) -> None:
        """Close what the store opened itself."""
        ...
