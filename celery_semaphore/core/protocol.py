"""A semaphore's validated settings (`SemaphoreSpec`) and the requests it makes of its
store (`celery_semaphore.core.requests`), checked and resolved here once for every store.

The stores turn requests into their own calls (the Redis store:
`celery_semaphore.core.redis.arguments`); the values replies become are in
`celery_semaphore.core.results`; waking is in `celery_semaphore.core.wakeups`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace

from . import requests, validation
from .ask import PLAIN, Ask
from .model.order import PLAIN_ASKED, Asked
from .model.parking import Dispatch
from .rates import RateLimit, parse_rate
from .results import SHADOW_CODES, Handover, Place

DEFAULT_NAMESPACE = "celery_semaphore"
DEFAULT_LEASE_TIMEOUT = 60.0
DEFAULT_WAITER_LEASE = 20.0
DEFAULT_RECHECK_INTERVAL = 2.0
DEFAULT_IDLE_TTL = 7 * 24 * 3600.0
DEFAULT_HANDOVER_WINDOW = 1.0
DEFAULT_HANDOVER_DEADLINE = 30.0
STATUS_MOST = 1000
#: The fair keys a status lists: those with the most waiters (see `SemaphoreStatus`).
FAIR_TOP = 20
#: How long a task published with a place is counted as sent (in the broker)
#: while it has not reached a worker; then it is presumed lost (a purged queue,
#: an expired message, a failed publish) and no longer counted.
SENT_HORIZON = 3600.0
#: Under a rate, parked waiters are handed over this long before their slots (or
#: three intervals, if longer; at most the handover window): long enough for a
#: published task to reach a worker, short enough that the workers hold few.
RATE_LEAD = 0.2
#: How long admissions stay paused after a data loss beyond the renewal interval:
#: time for a worker that notices the loss at its next beat to write its permits back.
PAUSE_MARGIN = 0.5


def rate_window(rate: RateLimit, handover_window: float) -> float:
    """How far ahead of their slots waiters under ``rate`` are handed over (dispatch()
    in common_after_free.lua computes the same from the rate in force)."""
    return min(handover_window, max(RATE_LEAD, 3 * rate.interval_us / 1_000_000))


def new_holder_id() -> str:
    return uuid.uuid4().hex


class SemaphoreSpec:
    """Validated settings of one semaphore, and the requests it makes of its store
    (each checked here, for every store)."""

    def __init__(
        self,
        name: str,
        limit: int | None,
        *,
        lease_timeout: float,
        namespace: str,
        waiter_lease: float,
        recheck_interval: float,
        idle_ttl: float,
        handover_window: float | None = None,
        handover_deadline: float = DEFAULT_HANDOVER_DEADLINE,
        family: str = "",
        pause_after_loss: float | None = None,
        rate: str | RateLimit | None = None,
        shadow: Iterable[str] = (),
        fair_weights: validation.FairWeights | None = None,
    ) -> None:
        self.name = validation.check_name(name)
        self.fair_weights = validation.check_fair_weights(fair_weights)
        self.family = validation.check_name(family, "family") if family != "" else ""
        if limit is None and rate is None:
            raise TypeError(
                f"limit (how many at once) or rate (how fast, like '20/s') must be given "
                f"for semaphore {name!r}, or both"
            )
        self.rate = None if rate is None else parse_rate(rate)
        #: The rate as the stores write it ('': none).
        self.rate_text = "" if self.rate is None else self.rate.encode()
        self.shadow = frozenset(validation.check_shadow(shadow))
        #: The shadow limits' codes: '', 'l' (the limit), 'r' (the rate) or 'lr'.
        self.shadow_codes = "".join(
            code for code, kind in SHADOW_CODES.items() if kind in self.shadow
        )
        #: Without a concurrency limit (a rate alone) the limit is the largest there is.
        self.limit = validation.MAX_LIMIT if limit is None else validation.check_limit(limit)
        self.lease_timeout = validation.check_seconds(lease_timeout, "lease_timeout")
        self.namespace = validation.check_namespace(namespace)
        self.waiter_lease = validation.check_seconds(waiter_lease, "waiter_lease")
        self.recheck_interval = validation.check_seconds(recheck_interval, "recheck_interval")
        idle = validation.check_seconds(idle_ttl, "idle_ttl")
        self.pause_after_loss = (
            self.lease_timeout / 4 + PAUSE_MARGIN
            if pause_after_loss is None
            else validation.check_seconds(pause_after_loss, "pause_after_loss")
        )
        self.idle_ms = int(1000 * max(idle, 2 * self.lease_timeout, 2 * self.waiter_lease))
        self.sent_horizon_ms = min(self.idle_ms, int(1000 * SENT_HORIZON))
        #: What the store needs to hand parked waiters over (None: this client
        #: publishes none): how far ahead, the deadline of a copy, the lead under a rate.
        self.dispatch: Dispatch | None = None
        if handover_window is not None:
            window = validation.check_seconds(handover_window, "handover_window", allow_zero=True)
            deadline = validation.check_seconds(handover_deadline, "handover_deadline")
            self.dispatch = Dispatch(
                int(window * 1000), int(deadline * 1000), int(RATE_LEAD * 1000)
            )

    def lease_ms(self, lease_timeout: float | None) -> int:
        if lease_timeout is None:  # the semaphore's own, checked when it was made
            return max(1, int(1000 * self.lease_timeout))
        return max(1, int(1000 * validation.check_seconds(lease_timeout, "lease_timeout")))

    def wait_ms(self, wait_lease: float | None, *, queue: bool = True) -> int:
        """A waiter lease in ms (``wait_lease`` None: the semaphore's own); 0 without
        ``queue`` (a refused contender keeps no place)."""
        if not queue:
            return 0
        seconds = self.waiter_lease if wait_lease is None else wait_lease
        return int(1000 * validation.check_seconds(seconds, "wait_lease"))

    def acquire(
        self,
        holder: str,
        ticket: int | None,
        *,
        queue: bool,
        wait_lease: float | None,
        lease_timeout: float | None,
        info: str,
        handover: int | None = None,
        in_place: bool = False,
        ask: Ask = PLAIN,
    ) -> requests.Acquire:
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        asked = self.resolve(ask)
        validation.check_ticket(handover, "handover")
        validation.check_info(info)
        return requests.Acquire(
            holder, ticket, self.wait_ms(wait_lease, queue=queue), self.lease_ms(lease_timeout),
            info, handover, in_place, asked,
        )  # fmt: skip

    def resolve(self, ask: Ask) -> Asked:
        """``ask`` checked against this semaphore's limit and burst (a weight that could
        never be granted is an error), its fair weight taken from ``fair_weights`` where
        the ask gives none."""
        weight, rate_weight, priority = ask.weight, ask.rate_weight, ask.priority
        if (
            ask.fair_key is None
            and weight.__class__ is int
            and weight == 1
            and (rate_weight is None or (rate_weight.__class__ is int and rate_weight == 1))
            and priority.__class__ is int
            and priority == 0
        ):
            return PLAIN_ASKED  # what the checks below answer for the default: 1|1, no priority
        permits, grants = validation.check_weights(
            weight,
            rate_weight,
            self.name,
            self.limit,
            None if self.rate is None else self.rate.burst,
        )
        priority = validation.check_priority(priority)
        if ask.fair_key is None:
            return Asked(permits, grants, priority)
        key = validation.check_fair_key(ask.fair_key)
        if ask.fair_weight is None:
            share = validation.fair_weight_of(self.fair_weights, key)
        else:
            share = validation.check_fair_weight(ask.fair_weight, key)
        return Asked(permits, grants, priority, key, share)

    def park(
        self,
        holder: str,
        ticket: int | None,
        payload: str,
        *,
        park_lease: float,
        info: str,
        due: float | None,
        ask: Ask | None = None,
    ) -> requests.Park:
        """``ask`` None keeps what the waiter's refused attempt recorded."""
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        validation.check_info(info)
        if not isinstance(payload, str):
            raise TypeError(f"payload must be a str, got {type(payload).__name__}")
        park_ms, due_ms = self._parking(park_lease, due)
        asked = None if ask is None else self.resolve(ask)
        return requests.Park(holder, ticket, payload, park_ms, info, due_ms, asked)

    def claim(self, taken: str, handover: Handover) -> requests.Claim:
        """``taken``: the task id of the message taken from a parking queue;
        ``handover``: the `Handover` that made the caller take it."""
        validation.check_holder(taken, "taken")
        if not isinstance(handover, Handover):
            raise TypeError(
                f"handover must be the Handover on_handover was given, got {handover!r:.80}"
            )
        validation.check_holder(handover.holder, "handover.holder")
        token = handover.token
        if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
            raise ValueError(f"handover.token must be a positive int, got {token!r}")
        return requests.Claim(taken, handover.holder, token)

    def drop(self, holders: Iterable[str]) -> tuple[str, ...]:
        """The holders a dispatch drops, checked."""
        return tuple(validation.check_holder(h) for h in holders)

    def enqueue(
        self,
        holder: str,
        wait_lease: float | None,
        info: str,
        ask: Ask = PLAIN,
        far: requests.ParkWhenFar | None = None,
    ) -> requests.Enqueue:
        validation.check_holder(holder)
        validation.check_info(info)
        asked = self.resolve(ask)
        return requests.Enqueue(holder, self.wait_ms(wait_lease), info, asked, far)

    def park_when_far(
        self,
        payload: str | tuple[str, str],
        *,
        window: float,
        park_lease: float,
        due: float | None,
    ) -> requests.ParkWhenFar:
        """``payload``: the text, or (head, tail) around its ticket."""
        head, tail = (payload, "") if isinstance(payload, str) else payload
        if not (isinstance(head, str) and isinstance(tail, str)):
            raise TypeError(f"payload must be a str or a pair of str, got {payload!r:.80}")
        park_ms, due_ms = self._parking(park_lease, due)
        window_us = int(1_000_000 * validation.check_seconds(window, "window", allow_zero=True))
        return requests.ParkWhenFar(window_us, head, tail, park_ms, due_ms)

    def _parking(self, park_lease: float, due: float | None) -> tuple[int, int]:
        """A parking's lease and due time in ms (0: no due time), checked."""
        if self.dispatch is None:
            raise ValueError(
                "park() needs a semaphore that publishes handovers: pass on_handover= "
                "(and handover_window=) to the semaphore"
            )
        park_ms = int(1000 * validation.check_seconds(park_lease, "park_lease"))
        due_ms = 0
        if due is not None:
            due_ms = max(1, int(1000 * validation.check_seconds(due, "due", allow_zero=True)))
        return park_ms, due_ms

    def binding(self, place: Place) -> Place:
        """``place`` as the limits that bind it see it: a shadow limit refuses nothing,
        so the line moves as if it were not there (common_rates.lua's line_limit(),
        line_room()): ``limit_binds`` False; a shadow rate: no slot, no pause."""
        if not self.shadow:
            return place
        if "limit" in self.shadow:
            place = replace(place, limit_binds=False)
        if "rate" in self.shadow:
            place = replace(place, rate_due=None, rate_paused_for=None)
        return place

    def release(self, holder: str, token: int | None, *, unused: int = 0) -> requests.Release:
        """``unused``: the rate grants to give back with a permit its task never used."""
        return requests.Release(validation.check_holder(holder), token, unused)

    def keep(self, holder: str, token: int, kept_as: str, info: str) -> requests.Release:
        """Keep ``holder``'s permit as ``kept_as`` where nobody waits, else release it."""
        return requests.Release(
            validation.check_holder(holder), token, 0, validation.check_holder(kept_as), info
        )

    def renew(
        self, holders: Sequence[tuple[str, int | None, int | None]], lease_ms: int
    ) -> requests.Renew:
        """``holders``: (holder, fencing token or None, permits held or None: as
        recorded)."""
        held = []
        for holder, token, permits in holders:  # the weight checked first, as before
            weight = None if permits is None else validation.check_limit(permits, "weight")
            held.append((validation.check_holder(holder), token, weight))
        return requests.Renew(tuple(held), lease_ms)


def acquire_all(
    specs: Sequence[SemaphoreSpec],
    holder: str,
    ticket: int | None,
    *,
    queue: bool,
    wait_lease: float | None,
    hold_back: float,
    lease_timeout: float | None,
    info: str,
    weights: Sequence[tuple[int, int | None]],
    priority: int = 0,
    fair_keys: Sequence[str | None] | None = None,
    fair_weight: int | None = None,
    handover: tuple[int, int] | None = None,
) -> requests.AcquireAll:
    """A request for a permit of each of ``specs`` at once. ``weights``: (permits,
    grants or None) per semaphore; ``fair_keys``: per semaphore, at most one not None;
    ``handover``: (index of the semaphore that handed it over, the `Handover`'s token)."""
    validation.check_holder(holder)
    validation.check_ticket(ticket)
    validation.check_info(info)
    hold_ms = int(1000 * validation.check_seconds(hold_back, "hold_back", allow_zero=True))
    if handover is not None:
        index, token = handover
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(specs):
            raise ValueError(
                f"handover must be (index of a semaphore of the set, token), got {handover!r}"
            )
        handover = (index, validation.check_ticket(token, "handover") or 0)
    keys = [None] * len(specs) if fair_keys is None else list(fair_keys)
    if len(keys) != len(specs) or sum(key is not None for key in keys) > 1:
        raise ValueError(
            f"fair_keys must give one value per semaphore ({len(specs)}), at most one of "
            f"them a key (a set takes one fair line), got {fair_keys!r}"
        )
    asks = tuple(
        spec.resolve(Ask(weight, rate_weight, priority, key, fair_weight))
        for spec, (weight, rate_weight), key in zip(specs, weights, keys, strict=True)
    )
    return requests.AcquireAll(
        holder,
        ticket,
        hold_ms,
        info,
        tuple(spec.wait_ms(wait_lease, queue=queue) for spec in specs),
        tuple(spec.lease_ms(lease_timeout) for spec in specs),
        asks,
        handover,
    )
