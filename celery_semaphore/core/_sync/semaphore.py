# Generated from celery_semaphore/core/_async/semaphore.py by scripts/unasync.py:
# do not edit; edit the asyncio source and run the script.
"""The fair, leased, distributed counting semaphore.

One source serves both APIs: ``core/_async/semaphore.py`` (asyncio) is written
by hand, and ``scripts/unasync.py`` generates ``core/_sync/semaphore.py`` from
it; the test command fails when the two differ.

Timeline of a wait, and why no wake-up is lost::

    waiter: attempt -> refused (queued, ticket T) -> SUBSCRIBE wake channel
    waiter: attempt again -> refused -> sleep until a message, the earliest
            holder's lease end, or the re-check interval
    holder: release -> script PUBLISHes (there are waiters) -> waiter wakes
    waiter: attempt -> granted if T is among the earliest live tickets

A release that lands between the first refusal and SUBSCRIBE is caught by the
second attempt, which runs after SUBSCRIBE.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from celery_semaphore.core import protocol, validation, wakeups
from celery_semaphore.core._sync.permit import Permit
from celery_semaphore.core._sync.store import Store
from celery_semaphore.core.ask import Ask, AskFields, ask_of
from celery_semaphore.core.constants import RELEASED
from celery_semaphore.core.errors import SemaphoreConnectionError, SemaphoreTimeout
from celery_semaphore.core.on_handover import (
    OnHandover,
    call_on_handover,
    check_on_handover,
)
from celery_semaphore.core.rates import RateLimit, parse_rate
from celery_semaphore.core.requests import Configure
from celery_semaphore.core.results import Claimed, Handover, Parked, Place, SemaphoreStatus
from celery_semaphore.core.stores import sync_store
from celery_semaphore.core.validation import FairWeights

#: Seconds before a waiter that lost its store first asks again, and at most between.
RECONNECT_FIRST = 0.05
RECONNECT_MOST = 1.0

if TYPE_CHECKING:
    import redis
    from typing_extensions import Unpack


class Semaphore:
    """At most ``limit`` holders at once across every client of one Redis.

    ``redis`` is a URL (`redis://`, `rediss://`, `unix://`, `redis+cluster://`,
    `redis+sentinel://`: see [Settings](settings.md#semaphore-constructor) for
    the forms) or a ready redis-py client of the matching kind (sync or asyncio);
    or ``memory://[name]``: the memory store, the reference model in this process
    (see [the memory store](settings.md#the-memory-store)).
    A client made from a URL is closed by `close()`; a client passed in is the
    caller's to close. ``url`` (the semaphore's ``url``, shown in error messages
    and ``repr`` with any password masked): the URL a client passed in was made
    from; by default, a description of the client.

    Guarantees (all arithmetic on the Redis server clock, one script call per
    operation):

    - never more live holders than the effective limit (the runtime override
      if set, else ``limit``);
    - grants go to the earliest live tickets first (FIFO);
    - a holder whose lease ran out is reclaimed by the next operation, and that
      wakes blocked waiters;
    - release and renew are idempotent and answer with a bool; acquiring with a
      holder id that holds a live permit returns that permit with a new token;
    - with ``rate`` ("20/s", "100/m", "1000/h", or a
      [RateLimit][celery_semaphore.RateLimit] with a burst), also never more grants
      than the rate allows (GCRA on the server clock: at most ``burst`` at once,
      then one every interval), in the same step and the same line: a waiter the
      rate refuses learns its slot (``Place.rate_due``) and sleeps until then;
      ``limit`` may then be left out (no cap on how many hold at once).
      `set_rate()` overrides it at run time, `pause_rate()` stops it for a while;
    - ``shadow`` lists limits ("limit", "rate") that only count and never refuse:
      a grant they would have refused is counted (metrics) and said on the permit
      (``Permit.shadow_refused``), so a limit can be tried before it is enforced.

    Parking (for callers that can bring a waiter back by publishing a message,
    such as a task queue): a waiter may `park()` with a payload instead of
    asking again. ``on_handover`` is then called with the parked waiters that
    become due (each a [Handover][celery_semaphore.Handover]: publish its
    ``payload``; the waiter comes back with ``attempt(holder, handover=token)``)
    by whichever call of this client made them due: a release, a reclaim, a
    raised limit, a resume, `dispatch()`; that call returns after it. The
    synchronous semaphore calls it inline; the asyncio one awaits a coroutine
    function, and runs a plain function in a thread (``asyncio.to_thread``: it
    must be thread-safe), so a blocking publish does not stall the event loop.
    ``handover_window`` (seconds) keeps the waiters whose turn is that near
    handed over ahead of time, so they already wait when a permit frees;
    ``handover_deadline``: a handed-over waiter that has not arrived by then is
    handed over again (and the late copy is refused as stale).

    Fair share: contenders that pass ``fair_key=`` (an account, a tenant) are served in
    turns between the keys that have waiters, FIFO within a key, so one key's backlog
    does not make another's first job wait behind all of it; a key alone takes every
    turn. ``fair_weights`` (a mapping of key to weight, or a function of the key; 1
    unless said) gives a key of weight 3 three turns for every one of a key of weight
    1. ``priority=`` on a contender orders the line (higher first; within its key's
    turns when it has a fair key). Give every contender of a fair line a fair key, and
    the same key and priority each time it asks: a contender without one takes a ticket
    in time, which may fall anywhere among the turns, and asking without its key counts
    a waiter out of its key.

    ``family``: the name of a group of semaphores made by one key function
    (``customer-1``, ``customer-2``, ... in family ``customer``), recorded in
    Redis with the semaphore; the metrics show a family as one series.

    When Redis loses its data (a restart without persistence, a failover to a
    replica that lagged), the first call of a client that had seen the data
    notices (see `celery_semaphore.core.redis.epochs`), and no permit is granted for
    ``pause_after_loss`` seconds (default: a quarter of ``lease_timeout``, the
    worker's renewal interval, plus 0.5 s), while the holders still running are
    written back by their renewals (`renew_many()`); then the line resumes in
    order. Waiters refused meanwhile learn when (``Place.resumes_in``).
    """

    def __init__(
        self,
        redis: str | redis.Redis | redis.RedisCluster | Store,
        name: str,
        limit: int | None = None,
        *,
        rate: str | RateLimit | None = None,
        shadow: Iterable[str] = (),
        lease_timeout: float = 60.0,
        namespace: str = "celery_semaphore",
        waiter_lease: float = 20.0,
        recheck_interval: float = 2.0,
        idle_ttl: float = 604800.0,
        on_handover: OnHandover | None = None,
        handover_window: float = 1.0,
        handover_deadline: float = 30.0,
        family: str = "",
        url: str = "",
        pause_after_loss: float | None = None,
        fair_weights: FairWeights | None = None,
    ) -> None:
        check_on_handover(on_handover)
        self._owns_store = isinstance(redis, str)
        self.store: Store = sync_store(redis, url)
        self._spec = protocol.SemaphoreSpec(
            name,
            limit,
            lease_timeout=lease_timeout,
            namespace=namespace,
            waiter_lease=waiter_lease,
            recheck_interval=recheck_interval,
            idle_ttl=idle_ttl,
            handover_window=None if on_handover is None else handover_window,
            handover_deadline=handover_deadline,
            family=family,
            pause_after_loss=pause_after_loss,
            rate=rate,
            shadow=shadow,
            fair_weights=fair_weights,
        )
        self.on_handover = on_handover
        #: Permits this client's renewals wrote back after Redis lost its data.
        self.restored = 0
        # Permits taken by ``with semaphore:``, per thread and per asyncio task.
        self._held: contextvars.ContextVar[tuple[Permit, ...]] = contextvars.ContextVar(
            f"celery_semaphore_held_{id(self)}", default=()
        )

    #: What its store's calls take (`protocol.SemaphoreSpec`).
    spec = property(lambda self: self._spec)
    name = property(lambda self: self._spec.name)
    limit = property(lambda self: self._spec.limit)
    rate = property(lambda self: self._spec.rate)
    lease_timeout = property(lambda self: self._spec.lease_timeout)
    #: The Redis keys (the Redis store's; AttributeError on another store).
    keys = property(lambda self: self.store.keys_of(self._spec))
    family = property(lambda self: self._spec.family)
    url = property(lambda self: self.store.url)
    #: The Redis client (the Redis store's; AttributeError on another store).
    client = property(lambda self: self.store.client)
    namespace = property(lambda self: self._spec.namespace)

    def __repr__(self) -> str:
        rate = "" if self.rate is None else f", rate={str(self.rate)!r}"
        return f"Semaphore({self.url!r}, name={self.name!r}, limit={self.limit}{rate})"

    def attempt(
        self,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        queue: bool = True,
        wait_lease: float | None = None,
        lease_timeout: float | None = None,
        info: str = "",
        handover: int | None = None,
        in_place: bool = False,
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> Permit | Place:
        """Take a permit if one is free and nobody earlier waits; else a `Place`.

        With ``queue`` (the default) a refused contender keeps a place in line
        for ``wait_lease`` seconds (default: the semaphore's ``waiter_lease``);
        asking again within that time, or presenting the returned ticket later,
        keeps the place (the [Place][celery_semaphore.Place] says where it
        stands). ``handover``: the token of the `Handover` that brought a parked
        waiter back; [StaleHandover][celery_semaphore.StaleHandover] if a newer
        copy of it was handed over or it was served already. ``in_place``: for
        `wait_for_turn()` only (the caller listens on the wake channel for a
        permit granted to it directly).

        ``weight``: the permits it takes at once (a batch that counts as k); ``rate_weight``:
        the rate's grants it spends (default: ``weight``). It waits in line until all
        of them are free, and those behind it wait for it (FIFO). Each must be at
        most the limit, and the rate's burst, or ValueError.

        ``priority`` (-255..255, higher first): a new place in line goes ahead of every
        less urgent waiter, in order among equals. ``fair_key``: the line is shared in
        turns between the keys that have waiters (FIFO within a key; the semaphore's
        ``fair_weights`` give a key more turns); with both, priority orders the key's
        own turns. ``fair_weight``: the key's weight here (default: what the semaphore's
        ``fair_weights`` give it). These only place a new ticket: a ticket presented
        again keeps its place. Give these five as keywords or as one
        ``ask=``[Ask][celery_semaphore.Ask] (every call below takes either).
        """
        ask = ask_of(ask, asked, "attempt")
        holder = protocol.new_holder_id() if holder is None else holder
        request = self._spec.acquire(
            holder,
            ticket,
            queue=queue,
            wait_lease=wait_lease,
            lease_timeout=lease_timeout,
            info=info,
            handover=handover,
            in_place=in_place,
            ask=ask,
        )
        result, handovers = self.store.acquire(self._spec, request)
        self._hand_over(handovers)
        if isinstance(result, Place):
            return self._spec.binding(result)
        return Permit(
            self, holder, result.fencing_token, result.expires_at, result.waited,
            shadow_refused=result.shadow_refused, shadow_wait=result.shadow_wait,
            weight=ask.weight, rate_weight=ask.starts,
        )  # fmt: skip

    def park(
        self,
        holder: str,
        payload: str,
        ticket: int | None = None,
        *,
        park_lease: float = 604800.0,
        info: str = "",
        due: float | None = None,
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> Parked:
        """Keep ``holder``'s place in line without asking: ``payload`` is handed to
        ``on_handover`` when the waiter is due (possibly at once: a permit may have
        freed since it was refused), or ``due`` seconds from now at the latest (by
        the next call that hands over: its wait budget runs out then). The place
        holds ``park_lease`` seconds. ``weight``/``rate_weight``: as in `attempt()`;
        None keeps what its refused attempt said (1 for a new place, and 1 when ``fair_key``
        or ``priority`` is given: the weight text is one, so give all of them together);
        an ``ask=`` says all of them.

        The semaphore is listed in its namespace's parked index first, where
        workers' heartbeats find it (`celery_semaphore.core.redis.parked_index`)."""
        if asked.get("weight", 0) is None:  # None: as before the Ask, "1 with an order"
            asked = {name: value for name, value in asked.items() if name != "weight"}  # type: ignore[assignment]
        given = ask_of(ask, asked, "park")
        says = ask is not None or asked.get("weight") is not None
        says = says or asked.get("fair_key") is not None or bool(asked.get("priority"))
        request = self._spec.park(
            holder, ticket, payload, park_lease=park_lease, info=info, due=due,
            ask=given if says else None,
        )  # fmt: skip
        self.store.list_parked(self._spec)
        parked, handovers = self.store.park(self._spec, request)
        self._hand_over(handovers)
        return parked

    def claim(self, taken: str, handover: Handover) -> Claimed:
        """Whose turn the message taken from a parking queue gets: for a caller that
        parks a waiter's message in a broker queue (the payload says which queue) and,
        given its `Handover`, takes that queue's head, whose task id ``taken`` may be
        another waiter's (the queue keeps arrival order, the line ticket order).

        The answer, a `Claimed` (`celery_semaphore.core.Claimed`), says what to do with
        the message: ``PUBLISH`` it with ``handover.token`` (if it is another parked
        waiter's, that waiter took the turn, and ``handover.holder`` waits for the
        next), drop a ``STALE`` copy, publish an ``ABSENT`` one without a token (its
        task is not parked here) and look further, put it back if ``VOID`` (the
        handover is not its waiter's latest any more). One atomic step; it hands
        over nobody."""
        request = self._spec.claim(taken, handover)
        return self.store.claim(self._spec, request)

    def dispatch(self, drop: Iterable[str] = ()) -> int:
        """Hand over the parked waiters that are due (after reclaiming run-out
        leases), and again those handed over whose deadline passed; how many.

        ``drop``: holders to take out of the line first if they are parked or
        handed over (revoked tasks); one asking in person or holding a permit stays.
        """
        if self._spec.dispatch is None:
            raise ValueError("dispatch() needs on_handover= on the semaphore")
        handovers = self.store.dispatch(self._spec, self._spec.drop(drop))
        self._hand_over(handovers)
        return len(handovers)

    def _hand_over(self, handovers: list[Handover]) -> None:
        if handovers and self.on_handover is not None:
            call_on_handover(self.on_handover, handovers)

    def take_place(
        self,
        holder: str,
        *,
        wait_lease: float | None = None,
        info: str = "",
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> Place:
        """Take a place in line for ``holder`` without asking for a permit.

        For a producer that wants its jobs served in submission order: the
        place holds for ``wait_lease`` s; later the job presents its
        ``ticket``. The `Place` also tells its position, the holders and the
        limit, so a producer can tell a near turn from a far one. ``weight``,
        ``rate_weight``: what the job will ask for (`attempt()`).
        """
        request = self._spec.enqueue(holder, wait_lease, info, ask_of(ask, asked, "take_place"))
        place, _, _ = self.store.enqueue(self._spec, request)
        return self._spec.binding(place)

    def take_place_or_park(
        self,
        holder: str,
        payload: str | tuple[str, str],
        *,
        window: float,
        wait_lease: float | None = None,
        park_lease: float = 604800.0,
        info: str = "",
        due: float | None = None,
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> tuple[Place, bool]:
        """`take_place()`, and in the same call `park()` if the turn of that place is
        far: the semaphore drains, or the rate's slot for it is more than ``window`` s
        away, or at least (free permits + limit) waiters are ahead of it. One round
        trip where a producer would otherwise take a place, then park.

        Returns the place and whether it parked. ``payload``: a pair (head, tail)
        parked as head + the place's ticket + tail (a message that names the ticket it
        is about to be given); a str is the head alone, so it is parked with the ticket
        appended (unlike `park()`, which parks its payload as it is). The place holds
        ``wait_lease`` s if it did not park, ``park_lease`` s if it did."""
        request = self._spec.enqueue(
            holder, wait_lease, info, ask_of(ask, asked, "take_place_or_park")
        )
        far = self._spec.park_when_far(payload, window=window, park_lease=park_lease, due=due)
        request = dataclasses.replace(request, far=far)
        self.store.list_parked(self._spec)
        place, parked, handovers = self.store.enqueue(self._spec, request)
        self._hand_over(handovers)
        return self._spec.binding(place), parked

    def try_acquire(
        self,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> Permit | None:
        """A permit if one can be granted now, else None.

        A refused contender that can come back (it gave a ``holder`` id or a
        ``ticket``) keeps its place in line for the waiter lease, so asking
        again with the same id is fair (FIFO among those who poll). An
        anonymous one cannot come back, so it keeps no place: else every
        refused ``try_acquire()`` in a polling loop would leave a place that
        blocks the line until its lease runs out.
        """
        queue = holder is not None or ticket is not None
        ask = ask_of(ask, asked, "try_acquire")
        result = self.attempt(holder, ticket, queue=queue, ask=ask)
        return result if isinstance(result, Permit) else None

    def acquire(
        self,
        timeout: float | None = None,
        holder: str | None = None,
        ticket: int | None = None,
        *,
        info: str = "",
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> Permit:
        """Wait in FIFO order for a permit (``weight`` of them: see `attempt()`);
        `SemaphoreTimeout` after ``timeout`` s.

        Anything that interrupts the wait (a cancelled task, KeyboardInterrupt, a
        signal handler's exception such as Celery's soft time limit) drops the
        place in line at once.
        """
        holder = protocol.new_holder_id() if holder is None else holder
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        validation.check_info(info)
        if timeout is not None:
            validation.check_seconds(timeout, "timeout", allow_zero=True)
        started = time.monotonic()
        try:
            result = self.wait_for_turn(
                timeout, holder, ticket, info=info, ask=ask_of(ask, asked, "acquire")
            )
        except BaseException:
            # Else the place would block the line until its waiter lease runs out.
            with contextlib.suppress(Exception):
                self._release(holder, None)
            raise
        if isinstance(result, Permit):
            return result
        self._release(holder, None)
        raise SemaphoreTimeout(
            self.name,
            result.limit,
            time.monotonic() - started,
            f"position {result.position} in line, {result.holders} holders",
        )

    def wait_for_turn(
        self,
        timeout: float | None,
        holder: str,
        ticket: int | None = None,
        *,
        wait_lease: float | None = None,
        info: str = "",
        refused: Place | None = None,
        ask: Ask | None = None,
        **asked: Unpack[AskFields],
    ) -> Permit | Place:
        """Like `acquire()`, but on timeout return the `Place`, still in line.

        While it waits (subscribed to the wake channel) the waiter is marked as
        waiting in place, so a release grants it the permit directly and tells it
        on the channel; the last attempt before giving up clears the mark (and
        returns the permit if one was granted meanwhile). If Redis goes away
        (restart, failover) the waiter reconnects and asks again with its ticket
        until ``timeout``; it raises
        [SemaphoreConnectionError][celery_semaphore.SemaphoreConnectionError] if
        Redis is still unreachable then. Anything that interrupts the wait drops
        the place, and a permit granted meanwhile. ``refused``: the `Place` the
        caller's own `attempt()` for ``holder`` returned just now; the wait then
        starts listening at once (one ask fewer).
        """
        if timeout is not None:
            validation.check_seconds(timeout, "timeout", allow_zero=True)
        ask = ask_of(ask, asked, "wait_for_turn")
        started = time.monotonic()
        result: Permit | Place
        if refused is not None:
            if not isinstance(refused, Place):
                raise TypeError(
                    "refused must be the Place that attempt() returned for this holder, "
                    f"got {type(refused).__name__}"
                )
            result = refused
        else:
            result = self.attempt(holder, ticket, wait_lease=wait_lease, info=info, ask=ask)
        if isinstance(result, Permit) or timeout == 0:
            return result
        place: Place = result
        pubsub = self.store.listen([self._spec])
        backoff, interrupted = RECONNECT_FIRST, False
        try:
            while True:
                ticket = place.ticket or ticket
                remaining = None if timeout is None else timeout - (time.monotonic() - started)
                try:
                    if pubsub is None:
                        pubsub = self.store.listen([self._spec])
                    if remaining is not None and remaining <= 0:
                        # The last ask clears the mark (or finds a permit granted meanwhile).
                        return self.attempt(
                            holder, ticket, wait_lease=wait_lease, info=info, ask=ask
                        )
                    result = self.attempt(
                        holder, ticket, wait_lease=wait_lease, info=info, in_place=True, ask=ask
                    )
                    if isinstance(result, Permit):
                        return result
                    place = result
                    pause = wakeups.pause(self._spec, place, remaining)
                    grant = self.store.wait_for_wakeup(pubsub, place.ticket, holder, pause)
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
                    continue
                if grant is not None:
                    return Permit(
                        self, holder, grant.fencing_token, grant.expires_at, grant.waited,
                        weight=ask.weight, rate_weight=ask.starts,
                    )  # fmt: skip
        except BaseException:
            interrupted = True
            with contextlib.suppress(Exception):
                self._release(holder, None)
            raise
        finally:
            self.store.unlisten(pubsub, keep=not interrupted)

    def release(self, holder: str) -> bool:
        """Release whatever ``holder`` holds and drop its place in line (idempotent)."""
        return self._release(holder, None)

    def _release(self, holder: str, token: int | None, *, unused: int = 0) -> bool:
        request = self._spec.release(holder, token, unused=unused)
        released, handovers = self.store.release(self._spec, request)
        self._hand_over(handovers)
        return released == RELEASED

    def _keep(self, permit: Permit, kept_as: str, info: str) -> int:
        """`KEPT` if ``permit`` is now kept as ``kept_as``, else whether it was released."""
        request = self._spec.keep(permit.holder, permit.fencing_token, kept_as, info)
        released, handovers = self.store.release(self._spec, request)
        self._hand_over(handovers)
        return released

    def renew_many(
        self,
        holders: Iterable[str | Permit],
        lease_timeout: float | None = None,
        *,
        weight: int | None = None,
    ) -> set[str]:
        """Extend every live holder's lease in one round trip; return the lost ones.
        ``weight``: the permits each holder given by id holds (None: 1), for those
        written back after Redis lost its data (a live holder's own record says)."""
        items = list(holders)
        permits = [h for h in items if isinstance(h, Permit)]
        held = [
            (h.holder, h.fencing_token, h.weight) if isinstance(h, Permit) else (h, None, weight)
            for h in items
        ]
        return self._renew(held, lease_timeout, permits)

    def _renew(
        self,
        held: Sequence[tuple[str, int | None, int | None]],
        lease_timeout: float | None,
        permits: Iterable[Permit] = (),
    ) -> set[str]:
        if not held:
            return set()
        lease_ms = self._spec.lease_ms(lease_timeout)
        request = self._spec.renew(held, lease_ms)
        expires_at, lost, handovers, restored = self.store.renew(self._spec, request)
        self.restored += restored
        self._hand_over(handovers)
        for permit in permits:
            if permit.holder not in lost:
                permit.expires_at = expires_at
        return lost

    def learn_epoch(self) -> None:
        """Learn the data epoch of this semaphore's Redis (of its Cluster slot) now,
        changing nothing, so that a loss of the data before this process's next call
        is noticed by it: a worker does this at start, before it runs anything."""
        self.store.learn_epoch(self._spec)

    def note_lost(self, count: int = 1) -> None:
        """Count ``count`` permits found lost by a caller that renews by holder id
        (``renew_many`` counts only the lost permits it was given as permits): the
        ``permits_lost_total`` metric."""
        self.store.note_lost(self._spec, count)

    def status(self) -> SemaphoreStatus:
        """Limits, live holders (with lease expiry), live waiters in line order, and
        tasks published with a place that have not reached a worker yet."""
        return self.store.status(self._spec)

    def set_limit(self, limit: int) -> int | None:
        """Override the limit at run time for every client; returns the previous override.

        Lowering it below the current holders evicts nobody: it admits nobody
        until they drop below. Raising it wakes waiters at once.
        """
        validation.check_limit(limit)
        return _int(self._configure("override", str(limit)))

    def clear_limit(self) -> int | None:
        """Drop the runtime override: back to each client's declared limit."""
        return _int(self._configure("override", ""))

    def set_rate(self, rate: str | RateLimit) -> RateLimit | None:
        """Override the rate at run time for every client ("100/m"); returns the
        previous override. It applies from the next grant on; a raised rate hands
        over the waiters now due at once."""
        spec = parse_rate(rate)
        return RateLimit.decode(self._configure("rate_override", spec.encode()) or "")

    def clear_rate(self) -> RateLimit | None:
        """Drop the runtime rate override: back to each client's declared rate."""
        return RateLimit.decode(self._configure("rate_override", "") or "")

    def pause_rate(self, seconds: float) -> None:
        """The rate grants nothing for ``seconds`` from now (the partner said "slow
        down": `RateLimited`); holders keep their permits. A pause that would end
        earlier than one already set changes nothing. Without a rate, nothing is paused."""
        validation.check_seconds(seconds, "seconds")
        self._configure("rate_pause", str(max(1, round(seconds * 1000))))

    def set_draining(self, draining: bool) -> bool:
        """While draining, nobody new is admitted; holders finish. Returns the previous state."""
        return self._configure("draining", "1" if draining else "") == "1"

    def _configure(self, field: str, value: str) -> str | None:
        previous, handovers = self.store.configure(self._spec, Configure(field, value))
        self._hand_over(handovers)
        return previous

    def __enter__(self) -> Permit:
        permit = self.acquire()
        self._held.set((*self._held.get(), permit))
        return permit

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        *rest, permit = self._held.get()
        self._held.set(tuple(rest))
        permit.release()

    def close(self) -> None:
        """Close the store (and its client) if this semaphore made it from a URL."""
        if self._owns_store:
            self.store.close()


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)
