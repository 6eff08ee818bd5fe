# Generated from celery_semaphore/core/_async/semaphore_set.py by scripts/unasync.py:
# do not edit; edit the asyncio source and run the script.
"""Several semaphores taken in one step: a permit on every one, or on none.

One source serves both APIs, like ``semaphore.py``: ``scripts/unasync.py`` generates
``core/_sync/semaphore_set.py`` from this file.

A contender that needs several limits at once (a queue's cap and a task's cap, a
GPU and a licence) must not hold one while it waits for another: two such
contenders could each hold what the other waits for. acquire_all.lua weighs every
semaphore as acquire.lua would, and grants on all of them or on none. Refused, the
contender stands in line, with one ticket, in the semaphores that refused it; so
two contenders are in the same order in every line they share, and none waits for
a later one (no deadlock).

Timeline of a wait (`wait_for_turn()`)::

    waiter: attempt -> refused by B (ticket T in B's line; A would admit: it leaves A)
    waiter: SUBSCRIBE every wake channel; attempt(hold_back) -> refused by B; it
            now also stands in A's line, so later tickets cannot take A's permit
            it needs
    holder of B: release -> B's script PUBLISHes -> waiter wakes
    waiter: attempt(hold_back) -> granted on A and B at once
    (or, at the deadline: attempt without hold_back -> it leaves A's line)

It is never marked as waiting in place: a release of B alone could not grant it A.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from celery_semaphore.core import protocol, validation, wakeups
from celery_semaphore.core._sync.permit import Permit
from celery_semaphore.core._sync.semaphore import (
    RECONNECT_FIRST,
    RECONNECT_MOST,
    Semaphore,
)
from celery_semaphore.core.errors import SemaphoreConnectionError, SemaphoreTimeout
from celery_semaphore.core.results import Places


class PermitSet:
    """The permits one contender holds on every semaphore of a set, granted together.

    Each is a normal permit of its semaphore (its own fencing token and lease);
    ``set[name]`` is the one of semaphore ``name``. Release and renew act on all of
    them, one script call per semaphore.
    """

    def __init__(self, permits: Sequence[Permit]) -> None:
        self.permits = tuple(permits)

    @property
    def holder(self) -> str:
        return self.permits[0].holder

    def __getitem__(self, name: str) -> Permit:
        for permit in self.permits:
            if permit.semaphore.name == name:
                return permit
        raise KeyError(name)

    def __iter__(self) -> Iterator[Permit]:
        return iter(self.permits)

    def __len__(self) -> int:
        return len(self.permits)

    def release(self) -> bool:
        """Give every permit back; False if any was already released or lost."""
        released = [permit.release() for permit in self.permits]
        return all(released)

    def give_back_unused(self) -> bool:
        """Give every permit back unused (see `Permit.give_back_unused`)."""
        given = [permit.give_back_unused() for permit in self.permits]
        return all(given)

    def renew(self, lease_timeout: float | None = None) -> bool:
        """Extend every lease from now; False if any permit is lost (the others are
        still renewed: release the set to give them back)."""
        renewed = [permit.renew(lease_timeout) for permit in self.permits]
        return all(renewed)

    def __enter__(self) -> PermitSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"PermitSet({list(self.permits)!r})"


class SemaphoreSet:
    """Semaphores of one Redis whose permits a contender takes all at once, or none.

    The semaphores must share a client (or be made from the same URL) and a
    namespace, and have distinct names; on a Redis Cluster their keys must be in one
    slot (a script touches one slot), else ValueError. Each keeps its own limit, rate,
    weights, shadow limits and handovers; the set adds no state in Redis.
    """

    def __init__(self, semaphores: Sequence[Semaphore]) -> None:
        self.semaphores = tuple(semaphores)
        if not self.semaphores:
            raise ValueError("semaphores must name at least one semaphore")
        self._first = self.semaphores[0]
        self._specs = [sem._spec for sem in self.semaphores]
        self.store = self._first.store
        problem = self.store.joint_problem([(sem.store, sem._spec) for sem in self.semaphores])
        if problem is not None:
            raise ValueError(problem)

    names = property(lambda self: [sem.name for sem in self.semaphores])

    def __repr__(self) -> str:
        return f"SemaphoreSet({self.names!r})"

    def _weights(
        self, weights: Sequence[int] | None, rate_weights: Sequence[int | None] | None
    ) -> list[tuple[int, int | None]]:
        count = len(self.semaphores)
        for given, argument in ((weights, "weights"), (rate_weights, "rate_weights")):
            if given is not None and len(given) != count:
                raise ValueError(
                    f"{argument} must give one value per semaphore ({count}), got {len(given)}"
                )
        return [
            (
                1 if weights is None else weights[i],
                None if rate_weights is None else rate_weights[i],
            )
            for i in range(count)
        ]

    def attempt(
        self,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        queue: bool = True,
        wait_lease: float | None = None,
        hold_back: float = 0.0,
        lease_timeout: float | None = None,
        info: str = "",
        weights: Sequence[int] | None = None,
        rate_weights: Sequence[int | None] | None = None,
        priority: int = 0,
        fair_keys: Sequence[str | None] | None = None,
        fair_weight: int | None = None,
        handover: tuple[int, int] | None = None,
    ) -> PermitSet | Places:
        """A permit on every semaphore if each would grant one now, else `Places`
        (and nothing taken anywhere: no permit, no grant of a rate).

        Refused, with ``queue``, it stands in line in the semaphores that refused it,
        for ``wait_lease`` s (default: each one's waiter lease), with one ticket in
        all of them (the smallest of ``ticket`` and its places there; else a new one);
        in the others only for ``hold_back`` s (0: it leaves their lines, so it delays
        nobody where it could have been served). ``weights``, ``rate_weights``: per
        semaphore, in the set's order (see `Semaphore.attempt`); ``priority``: as
        there, the same in every line. ``fair_keys``: per semaphore, the key of at most
        one of them (None for the others; ``fair_weight``: that key's weight, default its
        semaphore's ``fair_weights``): a new ticket is then placed at that key's turn in
        that line, and the same ticket stands in the others. ``handover``:
        (the index of the semaphore whose `Handover` brought it back, its token);
        [StaleHandover][celery_semaphore.StaleHandover] if a newer copy was handed
        over or it was served already.
        """
        holder = protocol.new_holder_id() if holder is None else holder
        request = protocol.acquire_all(
            self._specs,
            holder,
            ticket,
            queue=queue,
            wait_lease=wait_lease,
            hold_back=hold_back,
            lease_timeout=lease_timeout,
            info=info,
            weights=self._weights(weights, rate_weights),
            priority=priority,
            fair_keys=fair_keys,
            fair_weight=fair_weight,
            handover=handover,
        )
        result, handovers = self.store.acquire_all(self._specs, request)
        for sem, due in zip(self.semaphores, handovers, strict=True):
            sem._hand_over(due)
        if isinstance(result, Places):
            return Places(
                result.ticket,
                tuple(
                    spec.binding(place)
                    for spec, place in zip(self._specs, result.places, strict=True)
                ),
                result.refused_by,
            )
        given = self._weights(weights, rate_weights)
        permits = []
        for sem, grant, (weight, rate_weight) in zip(self.semaphores, result, given, strict=True):
            permits.append(
                Permit(
                    sem,
                    holder,
                    grant.fencing_token,
                    grant.expires_at,
                    grant.waited,
                    shadow_refused=grant.shadow_refused,
                    shadow_wait=grant.shadow_wait,
                    weight=weight,
                    rate_weight=weight if rate_weight is None else rate_weight,
                )
            )
        return PermitSet(permits)

    def try_acquire(
        self,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        weights: Sequence[int] | None = None,
        rate_weights: Sequence[int | None] | None = None,
        priority: int = 0,
        fair_keys: Sequence[str | None] | None = None,
        fair_weight: int | None = None,
    ) -> PermitSet | None:
        """The permits if all can be granted now, else None (a place in line kept
        only for a contender that can come back: see `Semaphore.try_acquire`)."""
        queue = holder is not None or ticket is not None
        result = self.attempt(
            holder,
            ticket,
            queue=queue,
            weights=weights,
            rate_weights=rate_weights,
            priority=priority,
            fair_keys=fair_keys,
            fair_weight=fair_weight,
        )
        return result if isinstance(result, PermitSet) else None

    def acquire(
        self,
        timeout: float | None = None,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        info: str = "",
        weights: Sequence[int] | None = None,
        rate_weights: Sequence[int | None] | None = None,
        priority: int = 0,
        fair_keys: Sequence[str | None] | None = None,
        fair_weight: int | None = None,
    ) -> PermitSet:
        """Wait in FIFO order until every semaphore grants at once;
        `SemaphoreTimeout` after ``timeout`` s, naming a semaphore that refused.
        Anything that interrupts the wait drops its places at once."""
        holder = protocol.new_holder_id() if holder is None else holder
        validation.check_holder(holder)
        started = time.monotonic()
        try:
            result = self.wait_for_turn(
                timeout,
                holder,
                ticket,
                info=info,
                weights=weights,
                rate_weights=rate_weights,
                priority=priority,
                fair_keys=fair_keys,
                fair_weight=fair_weight,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self.release(holder)
            raise
        if isinstance(result, PermitSet):
            return result
        self.release(holder)
        index = result.refused_by[0] if result.refused_by else 0
        place = result.places[index]
        raise SemaphoreTimeout(
            self.semaphores[index].name,
            place.limit,
            time.monotonic() - started,
            f"position {place.position} in line, {place.holders} holders",
        )

    def wait_for_turn(
        self,
        timeout: float | None,
        holder: str,
        ticket: int | None = None,
        *,
        wait_lease: float | None = None,
        info: str = "",
        weights: Sequence[int] | None = None,
        rate_weights: Sequence[int | None] | None = None,
        priority: int = 0,
        fair_keys: Sequence[str | None] | None = None,
        fair_weight: int | None = None,
        refused: Places | None = None,
    ) -> PermitSet | Places:
        """Like `acquire()`, but on timeout return the `Places`, still in the lines
        that refused it.

        It listens on every semaphore's wake channel and asks again when a message
        may admit its ticket, or at the earliest lease end, rate slot or resume among
        the semaphores that refused it. While it waits it also keeps its place in the
        lines of the others (``hold_back``: the waiter lease), so a later contender
        cannot take the permit it will need there; the last ask leaves those. If
        Redis goes away it reconnects and asks again until ``timeout``. Anything
        that interrupts the wait drops its places (and permits granted meanwhile).
        ``refused``: the `Places` the caller's own `attempt()` for ``holder``
        returned just now; the wait then starts listening at once (one ask fewer).
        """
        if timeout is not None:
            validation.check_seconds(timeout, "timeout", allow_zero=True)
        kwargs: dict[str, Any] = {"wait_lease": wait_lease, "info": info}
        kwargs.update(weights=weights, rate_weights=rate_weights, priority=priority)
        kwargs.update(fair_keys=fair_keys, fair_weight=fair_weight)
        started = time.monotonic()
        if refused is not None and not isinstance(refused, Places):
            raise TypeError(
                "refused must be the Places that attempt() returned for this holder, "
                f"got {type(refused).__name__}"
            )
        result = refused if refused is not None else self.attempt(holder, ticket, **kwargs)
        if isinstance(result, PermitSet) or timeout == 0:
            return result
        places: Places = result
        hold_back = wait_lease
        if hold_back is None:
            hold_back = max(spec.waiter_lease for spec in self._specs)
        pubsub = self.store.listen(self._specs)
        backoff, interrupted = RECONNECT_FIRST, False
        try:
            while True:
                ticket = places.ticket or ticket
                remaining = None if timeout is None else timeout - (time.monotonic() - started)
                try:
                    if pubsub is None:
                        pubsub = self.store.listen(self._specs)
                    if remaining is not None and remaining <= 0:
                        return self.attempt(holder, ticket, **kwargs)
                    result = self.attempt(holder, ticket, hold_back=hold_back, **kwargs)
                    if isinstance(result, PermitSet):
                        return result
                    places = result
                    self._sleep(pubsub, places, remaining)
                    backoff = RECONNECT_FIRST
                except SemaphoreConnectionError as error:
                    if not self.store.reconnectable(error) or (
                        remaining is not None and remaining <= 0
                    ):
                        raise
                    self.store.unlisten(pubsub, keep=False)
                    pubsub = None
                    pause = backoff if remaining is None else min(backoff, remaining)
                    time.sleep(pause)
                    backoff = min(backoff * 2, RECONNECT_MOST)
        except BaseException:
            interrupted = True
            with contextlib.suppress(Exception):
                self.release(holder)
            raise
        finally:
            self.store.unlisten(pubsub, keep=not interrupted)

    def _sleep(self, pubsub: Any, places: Places, remaining: float | None) -> None:
        """Until a wake-up that may admit its ticket, or the shortest pause among the
        semaphores that refused it runs out."""
        refusing = places.refused_by or range(len(self._specs))
        pause = min(wakeups.pause(self._specs[i], places.places[i], remaining) for i in refusing)
        self.store.wait_for_wakeup(pubsub, places.ticket, "", pause)

    def release(self, holder: str) -> bool:
        """Release what ``holder`` holds on every semaphore and drop its places in
        line (idempotent); True if it held a permit on every one."""
        released = [sem.release(holder) for sem in self.semaphores]
        return all(released)
