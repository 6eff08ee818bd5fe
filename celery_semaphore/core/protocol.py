"""A semaphore's validated settings and its scripts' arguments (`SemaphoreSpec`).

The replies are read in `celery_semaphore.core.replies`, the values they become are in
`celery_semaphore.core.results`, waking is in `celery_semaphore.core.wakeups`, and
several semaphores in one step in `celery_semaphore.core.joint`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from . import validation
from .ask import PLAIN, Ask
from .errors import StaleHandover
from .keys import ROLE_TYPES, SemaphoreKeys, semaphore_keys
from .rates import RateLimit, parse_rate
from .replies import (
    ConfigureReply,
    DispatchReply,
    Enqueued,
    EnqueuedOrParked,
    Granted,
    ParkReply,
    Refused,
    ReleaseReply,
    RenewReply,
    StaleCopy,
    enqueued_place,
    grant_of,
    place_of,
    read,
    status_of,
)
from .results import SHADOW_CODES, Grant, Handover, Parked, Place, SemaphoreStatus

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


def counts_args(fields: Sequence[str]) -> list[Any]:
    """counts.lua's arguments (before the epoch): the sent horizon of a semaphore
    opened with the default settings, as `open_semaphore()` does, and ``fields``."""
    return [int(1000 * SENT_HORIZON), *fields]


def rate_window(rate: RateLimit, handover_window: float) -> float:
    """How far ahead of their slots waiters under ``rate`` are handed over (dispatch()
    in common_after_free.lua computes the same from the rate in force)."""
    return min(handover_window, max(RATE_LEAD, 3 * rate.interval_us / 1_000_000))


def new_holder_id() -> str:
    return uuid.uuid4().hex


class SemaphoreSpec:
    """Validated settings of one semaphore and the wire format of its scripts."""

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
        cluster: bool = False,
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
        self.rate_arg = "" if self.rate is None else self.rate.encode()
        self.shadow = frozenset(validation.check_shadow(shadow))
        self.shadow_arg = "".join(
            code for code, kind in SHADOW_CODES.items() if kind in self.shadow
        )
        #: Without a concurrency limit (a rate alone) the limit is the largest there is.
        self.limit = validation.MAX_LIMIT if limit is None else validation.check_limit(limit)
        self.lease_timeout = validation.check_seconds(lease_timeout, "lease_timeout")
        self.namespace = validation.check_namespace(namespace)
        self.waiter_lease = validation.check_seconds(waiter_lease, "waiter_lease")
        self.recheck_interval = validation.check_seconds(recheck_interval, "recheck_interval")
        idle = validation.check_seconds(idle_ttl, "idle_ttl")
        self.keys: SemaphoreKeys = semaphore_keys(self.namespace, self.name, cluster=cluster)
        self.pause_after_loss = (
            self.lease_timeout / 4 + PAUSE_MARGIN
            if pause_after_loss is None
            else validation.check_seconds(pause_after_loss, "pause_after_loss")
        )
        self.idle_ms = int(1000 * max(idle, 2 * self.lease_timeout, 2 * self.waiter_lease))
        self.sent_horizon_ms = min(self.idle_ms, int(1000 * SENT_HORIZON))
        # What the scripts need to hand parked waiters over ('': this client publishes none).
        self.dispatch = ""
        if handover_window is not None:
            window = validation.check_seconds(handover_window, "handover_window", allow_zero=True)
            deadline = validation.check_seconds(handover_deadline, "handover_deadline")
            self.dispatch = f"{int(window * 1000)}|{int(deadline * 1000)}|{int(RATE_LEAD * 1000)}"

    def lease_ms(self, lease_timeout: float | None) -> int:
        if lease_timeout is None:  # the semaphore's own, checked when it was made
            return max(1, int(1000 * self.lease_timeout))
        return max(1, int(1000 * validation.check_seconds(lease_timeout, "lease_timeout")))

    def acquire_args(
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
    ) -> list[Any]:
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        weight_arg = self.weight_arg(ask)
        validation.check_ticket(handover, "handover")
        validation.check_info(info)
        wait_seconds = self.waiter_lease if wait_lease is None else wait_lease
        wait_ms = int(1000 * validation.check_seconds(wait_seconds, "wait_lease")) if queue else 0
        return [
            holder,
            self.limit,
            self.lease_ms(lease_timeout),
            wait_ms,
            "" if ticket is None else ticket,
            info,
            self.idle_ms,
            self.keys.channel,
            "" if handover is None else handover,
            self.dispatch,
            "1" if in_place else "",
            self.family,
            self.rate_arg,
            self.shadow_arg,
            weight_arg,
        ]

    def weight_arg(self, ask: Ask) -> str:
        """The scripts' weight text, "<permits>|<grants>" ('' for 1|1), checked against
        this semaphore's limit and burst: a weight that could never be granted is an
        error; then "|<priority>" and "|<fair weight>|<fair key>" where they are given
        (see "The order of the line" in lua/common_order.lua). ``fair_weight`` None: the
        semaphore's ``fair_weights`` say."""
        weight, rate_weight, priority = ask.weight, ask.rate_weight, ask.priority
        if (
            ask.fair_key is None
            and weight.__class__ is int
            and weight == 1
            and (rate_weight is None or (rate_weight.__class__ is int and rate_weight == 1))
            and priority.__class__ is int
            and priority == 0
        ):
            return ""  # what the checks below answer for the default: 1|1, no priority
        permits, grants = validation.check_weights(
            weight,
            rate_weight,
            self.name,
            self.limit,
            None if self.rate is None else self.rate.burst,
        )
        priority = validation.check_priority(priority)
        if ask.fair_key is not None:
            key = validation.check_fair_key(ask.fair_key)
            if ask.fair_weight is None:
                share = validation.fair_weight_of(self.fair_weights, key)
            else:
                share = validation.check_fair_weight(ask.fair_weight, key)
            return f"{permits}|{grants}|{priority}|{share}|{key}"
        if priority:
            return f"{permits}|{grants}|{priority}"
        return "" if permits == grants == 1 else f"{permits}|{grants}"

    def park_args(
        self,
        holder: str,
        ticket: int | None,
        payload: str,
        *,
        park_lease: float,
        info: str,
        due: float | None,
        ask: Ask | None = None,
    ) -> list[Any]:
        """``ask`` None keeps what the waiter's refused attempt recorded."""
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        validation.check_info(info)
        if not isinstance(payload, str):
            raise TypeError(f"payload must be a str, got {type(payload).__name__}")
        park_ms, due_ms = self._parking(park_lease, due)
        weight_arg = "" if ask is None else (self.weight_arg(ask) or "1|1")
        return [holder, "" if ticket is None else ticket, payload, park_ms, info, self.idle_ms,
                self.dispatch, due_ms, self.keys.channel, weight_arg]  # fmt: skip

    def dispatch_args(self, drop: Iterable[str] = ()) -> list[Any]:
        """Declares no limit (see effective_limit() in common_meta.lua): the heartbeat calls
        it on semaphores it knows only by name."""
        return [self.idle_ms, self.keys.channel, self.dispatch,
                *(validation.check_holder(h) for h in drop)]  # fmt: skip

    def enqueue_args(
        self, holder: str, wait_lease: float | None, info: str, ask: Ask = PLAIN
    ) -> list[Any]:
        validation.check_holder(holder)
        validation.check_info(info)
        weight_arg = self.weight_arg(ask)
        seconds = self.waiter_lease if wait_lease is None else wait_lease
        wait_ms = int(1000 * validation.check_seconds(seconds, "wait_lease"))
        return [holder, wait_ms, info, self.idle_ms, self.limit, self.family,
                self.sent_horizon_ms, self.keys.channel, self.rate_arg, weight_arg,
                self.shadow_arg]  # fmt: skip

    def park_when_far_args(
        self,
        payload: str | tuple[str, str],
        *,
        window: float,
        park_lease: float,
        due: float | None,
    ) -> list[Any]:
        """What enqueue.lua takes after `enqueue_args()` to park the waiter when its turn
        is far (ARGV[12..17]); ``payload``: the text, or (head, tail) around its ticket."""
        head, tail = (payload, "") if isinstance(payload, str) else payload
        if not (isinstance(head, str) and isinstance(tail, str)):
            raise TypeError(f"payload must be a str or a pair of str, got {payload!r:.80}")
        park_ms, due_ms = self._parking(park_lease, due)
        window_us = int(1_000_000 * validation.check_seconds(window, "window", allow_zero=True))
        return [window_us, head, tail, park_ms, self.dispatch, due_ms]

    def _parking(self, park_lease: float, due: float | None) -> tuple[int, int]:
        """A parking's lease and due time in ms (0: no due time), checked."""
        if not self.dispatch:
            raise ValueError(
                "park() needs a semaphore that publishes handovers: pass on_handover= "
                "(and handover_window=) to the semaphore"
            )
        park_ms = int(1000 * validation.check_seconds(park_lease, "park_lease"))
        due_ms = 0
        if due is not None:
            due_ms = max(1, int(1000 * validation.check_seconds(due, "due", allow_zero=True)))
        return park_ms, due_ms

    def parse_enqueue(self, reply: Sequence[Any]) -> Place:
        return self.binding(enqueued_place(read(Enqueued, reply)))

    def parse_enqueue_or_park(self, reply: Sequence[Any]) -> tuple[Place, bool, list[Handover]]:
        place = read(EnqueuedOrParked, reply)
        return self.binding(enqueued_place(place)), place.parked, place.handovers

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

    def release_args(self, holder: str, token: int | None, *, unused: int = 0) -> list[Any]:
        """``unused``: the rate grants to give back with a permit its task never used."""
        validation.check_holder(holder)
        return [holder, "" if token is None else token, self.idle_ms, self.keys.channel,
                self.dispatch, self.limit, unused or "", self.shadow_arg]  # fmt: skip

    def renew_args(
        self, holders: Sequence[tuple[str, int | None, int | None]], lease_ms: int
    ) -> list[Any]:
        """``holders``: (holder, fencing token or None, permits held or None: as
        recorded). Declares no limit, like `dispatch_args()` and `configure_args()`."""
        args: list[Any] = [lease_ms, self.idle_ms, self.keys.channel, self.dispatch]
        for holder, token, permits in holders:
            weight = "" if permits is None else validation.check_limit(permits, "weight")
            args += [validation.check_holder(holder), "" if token is None else token, weight]
        return args

    def configure_args(self, field: str, value: str) -> list[Any]:
        return [field, value, self.idle_ms, self.keys.channel, self.dispatch, self.rate_arg]

    def status_args(self) -> list[Any]:
        return [STATUS_MOST, self.sent_horizon_ms, self.limit, self.rate_arg, FAIR_TOP]

    def parse_acquire(self, reply: Sequence[Any]) -> tuple[Grant | Place, list[Handover]]:
        """The attempt's outcome and the parked waiters it made due (by reclaiming)."""
        code, *values = reply
        if code == 1:
            granted = read(Granted, values)
            return grant_of(granted), granted.handovers
        if code == 0:
            refused = read(Refused, values)
            return self.binding(place_of(refused)), refused.handovers
        if code == 2:
            raise StaleHandover(self.name, read(StaleCopy, values).token)
        raise ValueError(f"acquire.lua answered with unknown code {code!r}")

    @staticmethod
    def parse_park(reply: Sequence[Any]) -> tuple[Parked, list[Handover]]:
        parked = read(ParkReply, reply)
        return Parked(parked.ticket, parked.position), parked.handovers

    @staticmethod
    def parse_dispatch(reply: Sequence[Any]) -> list[Handover]:
        return read(DispatchReply, reply).handovers

    @staticmethod
    def parse_release(reply: Sequence[Any]) -> tuple[bool, list[Handover]]:
        released = read(ReleaseReply, reply)
        return released.released, released.handovers

    @staticmethod
    def parse_renew(reply: Sequence[Any]) -> tuple[float, set[str], list[Handover], int]:
        renewed = read(RenewReply, reply)
        return renewed.expires_ms / 1000, set(renewed.lost), renewed.handovers, renewed.restored

    @staticmethod
    def parse_configure(reply: Sequence[Any]) -> tuple[str | None, list[Handover]]:
        configured = read(ConfigureReply, reply)
        return configured.previous or None, configured.handovers

    def parse_status(self, reply: Sequence[Any]) -> SemaphoreStatus:
        return status_of(self.name, reply)

    def expected_types(self) -> Iterable[tuple[str, str]]:
        return zip(self.keys.call_keys, (*ROLE_TYPES, "hash"), strict=True)
