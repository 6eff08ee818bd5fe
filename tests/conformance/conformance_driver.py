"""One operation, two semaphores: a store's (through the public `Semaphore` API) and
the reference model's (`celery_semaphore.core.model`), compared reply by reply.

A store is anything that makes `Semaphore`-like objects and tells its clock
(`Store`): the Redis stores in ``conftest.py``; a future store passes the same suite
by providing one. The model is the oracle: it is given the store's clock, read just
before each call, so the two see nearly the same times; where a value is the clock
itself (tickets, tokens, slots), the comparison is of orders (tickets and tokens are
bound one to one, and every new pair must sit in the same order among all pairs
seen) or within `CLOCK_SLACK`, never of raw µs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery_semaphore import Handover, Permit, Place, RateLimit, StaleHandover
from celery_semaphore.core import model
from celery_semaphore.core.model import Asked, Caller, SemaphoreModel
from celery_semaphore.core.rates import parse_rate

#: How far apart a store's time-valued replies (slots, pauses, lateness) may be from the
#: model's: the time between the clock reading given to the model and the store's own.
CLOCK_SLACK = 0.25
LONG = 600.0  # seconds: leases that time plays no part in


class Store(Protocol):
    """What the suite needs of a store: semaphores of it, and its clock."""

    name: str

    def semaphore(self, limit: int | None, **options: Any) -> Any:
        """A new semaphore (a fresh name) of this store, as `Semaphore(url, name, limit,
        **options)` makes one."""

    def now_us(self) -> int:
        """The store's clock, in µs: the time its operations read."""


@dataclass
class Bijection:
    """Store values (tickets, tokens) bound one to one to the model's, in the same order."""

    what: str
    to_model: dict[int, int] = field(default_factory=dict)
    to_store: dict[int, int] = field(default_factory=dict)

    def bind(self, store: int, modelled: int) -> None:
        if store in self.to_model or modelled in self.to_store:
            assert self.to_model.get(store) == modelled, (self.what, store, modelled)
            assert self.to_store.get(modelled) == store, (self.what, store, modelled)
            return
        for s, m in self.to_model.items():
            assert (store > s) == (modelled > m) and (store < s) == (modelled < m), (
                f"{self.what} {store} (model {modelled}) is not in the model's order "
                f"against {s} (model {m})"
            )
        self.to_model[store] = modelled
        self.to_store[modelled] = store


def near(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= CLOCK_SLACK


def model_rate(rate: RateLimit | None) -> model.Rate | None:
    return None if rate is None else model.Rate(rate.interval_us, rate.burst)


def rate_text(rate: RateLimit | model.Rate | None) -> str:
    if rate is None:
        return ""
    if isinstance(rate, RateLimit):
        return rate.encode()
    return f"{rate.interval_us}|{rate.burst}"


class Pair:
    """A store's semaphore and the model of it, driven together (every method makes the
    same call on both and asserts the replies agree; `check()` compares ``status()``)."""

    def __init__(
        self,
        store: Store,
        limit: int | None = 1,
        *,
        rate: str | RateLimit | None = None,
        shadow: tuple[str, ...] = (),
        fair_weights: Mapping[str, int] | None = None,
        lease: float = LONG,
        waiter_lease: float = LONG,
        handover_window: float | None = None,
        handover_deadline: float = 30.0,
        sem: Any = None,
        model_of: SemaphoreModel | None = None,
    ) -> None:
        self.store = store
        #: What the store handed over during the current call (its on_handover).
        self.received: list[Handover] = []
        publishing: dict[str, Any] = {}
        dispatch = None
        if handover_window is not None:
            publishing = dict(
                on_handover=self.received.extend, handover_window=handover_window,
                handover_deadline=handover_deadline,
            )  # fmt: skip
            dispatch = model.Dispatch(int(handover_window * 1000), int(handover_deadline * 1000))
        self.sem = sem or store.semaphore(
            limit, rate=rate, shadow=shadow, fair_weights=fair_weights,
            lease_timeout=lease, waiter_lease=waiter_lease, **publishing,
        )  # fmt: skip
        self.model = model_of or SemaphoreModel()
        self.caller = Caller(
            limit=self.sem.limit,
            rate=model_rate(self.sem.rate),
            shadow=("l" if "limit" in shadow else "") + ("r" if "rate" in shadow else ""),
            dispatch=dispatch,
        )
        self.shadow = frozenset(shadow)
        self.fair_weights = dict(fair_weights or {})
        self.lease_ms = max(1, int(1000 * lease))
        self.waiter_lease_ms = int(1000 * waiter_lease)
        self.tickets = Bijection("ticket")
        self.tokens = Bijection("fencing token")
        self.handover_tokens = Bijection("handover token")
        #: The handover tokens each waiter was handed over with, oldest first.
        self.copies: dict[str, list[int]] = {}
        #: Every permit granted, with the model's token for it and the caller (the client
        #: that asked: its own release and renew declare what it declares). Many are
        #: stale later.
        self.permits: list[tuple[Permit, int, Caller]] = []

    def sibling(self, limit: int | None, **options: Any) -> Pair:
        """Another client of the same semaphore (same store, same model) that declares
        its own ``limit`` (and rate, shadow limits)."""
        sem = self.store.semaphore(
            limit, name=self.sem.name, lease_timeout=LONG, waiter_lease=LONG, **options
        )
        other = Pair(
            self.store, sem=sem, model_of=self.model, shadow=options.get("shadow", ()),
            fair_weights=options.get("fair_weights"),
        )  # fmt: skip
        other.tickets, other.tokens, other.permits = self.tickets, self.tokens, self.permits
        other.handover_tokens, other.copies = self.handover_tokens, self.copies
        return other

    def now(self) -> int:
        """The store's clock for the call about to be made (and a clean slate for what
        the call hands over)."""
        self.received.clear()
        return self.store.now_us()

    def in_store_terms(self, holder: str, payload: str) -> str:
        """A payload the model made around its ticket (take_place_or_park), with the
        store's ticket for it instead."""
        waiting = self.model.waiters.get(holder)
        if waiting is None or waiting.ticket not in self.tickets.to_store:
            return payload
        return payload.replace(str(waiting.ticket), str(self.tickets.to_store[waiting.ticket]))

    def handed_over(self) -> list[Handover]:
        """The call's handovers, the store's against the model's: the same waiters in the
        same order, with their payloads, delays, and tokens in the model's order."""
        got = list(self.received)
        wanted = [
            (h.holder, self.in_store_terms(h.holder, h.payload)) for h in self.model.handovers
        ]
        assert [(h.holder, h.payload) for h in got] == wanted
        for real, expected in zip(got, self.model.handovers, strict=True):
            self.handover_tokens.bind(real.token, expected.token)
            self.copies.setdefault(real.holder, []).append(real.token)
            assert near(real.delay, expected.delay_ms / 1000)
        return got

    def ask(
        self,
        weight: int = 1,
        rate_weight: int | None = None,
        priority: int = 0,
        fair_key: str | None = None,
    ) -> Asked:
        return Asked(
            permits=weight,
            grants=weight if rate_weight is None else rate_weight,
            priority=priority,
            fair_key=fair_key,
            fair_weight=1 if fair_key is None else self.fair_weights.get(fair_key, 1),
        )

    # Operations -------------------------------------------------------------------

    def attempt(
        self,
        holder: str,
        ticket: int | None = None,
        *,
        queue: bool = True,
        weight: int = 1,
        rate_weight: int | None = None,
        priority: int = 0,
        fair_key: str | None = None,
        info: str = "",
        lease: float | None = None,
        handover: int | None = None,
    ) -> Permit | Place | None:
        """``ticket``: a ticket the store gave (the model gets its own for it); so is
        ``handover``, a handover token. None: the copy was stale (StaleHandover)."""
        result: Permit | Place | None
        modelled_ticket = None if ticket is None else self.tickets.to_model[ticket]
        modelled_handover = None if handover is None else self.handover_tokens.to_model[handover]
        now = self.now()
        try:
            result = self.sem.attempt(
                holder, ticket, queue=queue, weight=weight, rate_weight=rate_weight,
                priority=priority, fair_key=fair_key, info=info, lease_timeout=lease,
                handover=handover,
            )  # fmt: skip
        except StaleHandover as stale:
            result = None
            latest = stale.token
        expected = self.model.attempt(
            self.caller, holder, now,
            lease_ms=self.lease_ms if lease is None else max(1, int(1000 * lease)),
            waiter_lease_ms=self.waiter_lease_ms if queue else 0,
            ticket=modelled_ticket, ask=self.ask(weight, rate_weight, priority, fair_key),
            info=info, handover=modelled_handover,
        )  # fmt: skip
        self.handed_over()
        if isinstance(expected, model.Stale):
            assert result is None, (holder, result, expected)
            self.handover_tokens.bind(latest, expected.token)
        elif isinstance(expected, model.Granted):
            assert isinstance(result, Permit), (holder, result, expected)
            self.granted(result, expected)
        else:
            assert isinstance(result, Place), (holder, result, expected)
            self.refused(result, expected)
        return result

    def granted(self, permit: Permit, expected: model.Granted) -> None:
        seen = self.tokens.to_model
        assert permit.fencing_token > max(seen, default=0), "fencing tokens must increase"
        self.tokens.bind(permit.fencing_token, expected.token)
        self.permits.append((permit, expected.token, self.caller))
        assert near(permit.expires_at, expected.expires_ms / 1000)
        assert near(permit.waited, expected.waited_ms / 1000)
        assert permit.shadow_refused == frozenset(
            {"l": "limit", "r": "rate"}[c] for c in expected.shadow
        )
        assert near(permit.shadow_wait, expected.shadow_wait_ms / 1000)

    def refused(self, place: Place, expected: model.Refused) -> None:
        got = (place.position, place.holders, place.limit, place.draining)
        assert got == (expected.position, expected.holders, expected.limit, expected.draining)
        assert (place.ticket == 0) == (expected.ticket == 0), (place, expected)
        if place.ticket:
            self.tickets.bind(place.ticket, expected.ticket)
        assert (place.next_expiry_in is None) == (expected.earliest_expiry_ms == 0)
        slot = None if expected.slot_us is None else expected.slot_us / 1_000_000
        pause = expected.rate_pause_ms or None
        if "rate" in self.shadow:
            slot = pause = None  # the client hides a shadow rate's slot (binding())
        assert near(place.rate_due, slot), (place.rate_due, slot)
        assert (place.rate_due == 0) == (slot == 0), (place.rate_due, slot)
        assert (place.rate_paused_for is None) == (pause is None)
        assert place.limit_binds == ("limit" not in self.shadow)

    def take_place(
        self,
        holder: str,
        *,
        weight: int = 1,
        rate_weight: int | None = None,
        priority: int = 0,
        fair_key: str | None = None,
        info: str = "",
    ) -> Place:
        now = self.now()
        place: Place = self.sem.take_place(
            holder, weight=weight, rate_weight=rate_weight, priority=priority,
            fair_key=fair_key, info=info,
        )  # fmt: skip
        expected = self.model.take_place(
            self.caller, holder, now, waiter_lease_ms=self.waiter_lease_ms,
            ask=self.ask(weight, rate_weight, priority, fair_key), info=info,
        )  # fmt: skip
        got = (place.position, place.holders, place.limit, place.draining)
        assert got == (expected.position, expected.holders, expected.limit, expected.draining)
        self.tickets.bind(place.ticket, expected.ticket)
        slot = None if expected.slot_us is None else expected.slot_us / 1_000_000
        if "rate" in self.shadow:
            slot = None
        assert near(place.rate_due, slot), (place.rate_due, slot)
        assert (place.rate_due == 0) == (slot == 0), (place.rate_due, slot)
        return place

    def take_place_or_park(
        self,
        holder: str,
        payload: str,
        *,
        window: float,
        due: float | None = None,
        priority: int = 0,
        fair_key: str | None = None,
    ) -> tuple[Place, bool]:
        assert self.caller.dispatch is not None, "a pair made with handover_window="
        now = self.now()
        place, parked = self.sem.take_place_or_park(
            holder, payload, window=window, park_lease=LONG, due=due, priority=priority,
            fair_key=fair_key,
        )  # fmt: skip
        far = model.ParkIfFar(
            window_us=int(1_000_000 * window), head=payload, tail="",
            park_lease_ms=int(1000 * LONG), dispatch=self.caller.dispatch,
            due_ms=0 if due is None else max(1, int(1000 * due)),
        )  # fmt: skip
        expected = self.model.take_place(
            self.caller, holder, now, waiter_lease_ms=self.waiter_lease_ms, park_if_far=far,
            ask=self.ask(priority=priority, fair_key=fair_key),
        )  # fmt: skip
        got = (place.position, place.holders, place.limit, place.draining, parked)
        assert got == (
            expected.position, expected.holders, expected.limit, expected.draining,
            expected.parked,
        )  # fmt: skip
        self.tickets.bind(place.ticket, expected.ticket)
        self.handed_over()
        return place, parked

    def release(self, holder: str) -> bool:
        now = self.now()
        released = self.sem.release(holder)
        assert released is self.model.release(self.caller, holder, now)
        self.handed_over()
        return bool(released)

    def park(
        self,
        holder: str,
        payload: str,
        ticket: int | None = None,
        *,
        due: float | None = None,
        priority: int = 0,
        fair_key: str | None = None,
    ) -> model.ParkedPlace:
        """Without ``priority`` or ``fair_key`` the waiter keeps its recorded ask."""
        modelled_ticket = None if ticket is None else self.tickets.to_model[ticket]
        asks = fair_key is not None or priority != 0
        now = self.now()
        asked: dict[str, Any] = {"priority": priority, "fair_key": fair_key} if asks else {}
        parked = self.sem.park(holder, payload, ticket, due=due, park_lease=LONG, **asked)
        expected = self.model.park(
            self.caller, holder, payload, now, ticket=modelled_ticket,
            park_lease_ms=int(1000 * LONG),
            due_ms=0 if due is None else max(1, int(1000 * due)),
            ask=self.ask(priority=priority, fair_key=fair_key) if asks else None,
        )  # fmt: skip
        assert parked.position == expected.position
        self.tickets.bind(parked.ticket, expected.ticket)
        self.handed_over()
        return expected

    def dispatch(self, drop: tuple[str, ...] = ()) -> list[Handover]:
        now = self.now()
        count = self.sem.dispatch(drop)
        self.model.dispatch(self.caller, now, drop)
        assert count == len(self.model.handovers)
        return self.handed_over()

    def release_permit(self, index: int, *, unused: bool = False) -> bool:
        permit, token, caller = self.permits[index]
        now = self.now()
        released = permit.give_back_unused() if unused else permit.release()
        expected = self.model.release(
            caller, permit.holder, now, token, unused=permit.rate_weight if unused else 0
        )
        assert released is expected, (permit, token)
        self.handed_over()
        return bool(released)

    def renew_permit(self, index: int) -> bool:
        permit, token, caller = self.permits[index]
        now = self.now()
        renewed = permit.renew()
        _, lost = self.model.renew(
            [(permit.holder, token)], self.lease_ms, now, dispatch=caller.dispatch
        )
        assert renewed is (permit.holder not in lost), (permit, token)
        self.handed_over()
        return bool(renewed)

    def renew_many(self, holders: list[str]) -> set[str]:
        now = self.now()
        lost = self.sem.renew_many(holders)
        _, expected = self.model.renew(
            [(h, None) for h in holders], self.lease_ms, now, dispatch=self.caller.dispatch
        )
        assert lost == set(expected)
        self.handed_over()
        return set(lost)

    def set_limit(self, limit: int | None) -> None:
        now = self.now()
        previous = self.sem.set_limit(limit) if limit is not None else self.sem.clear_limit()
        assert previous == self.model.set_override(limit, now, self.caller)
        self.handed_over()

    def set_draining(self, draining: bool) -> None:
        now = self.now()
        assert self.sem.set_draining(draining) is self.model.set_draining(
            draining, now, self.caller
        )
        self.handed_over()

    def set_rate(self, rate: str | None) -> None:
        now = self.now()
        if rate is None:
            previous = self.sem.clear_rate()
            expected = self.model.set_rate_override(None, now, self.caller)
        else:
            previous = self.sem.set_rate(rate)
            expected = self.model.set_rate_override(model_rate(parse_rate(rate)), now, self.caller)
        assert rate_text(previous) == rate_text(expected)
        self.handed_over()

    def pause_rate(self, seconds: float) -> None:
        now = self.now()
        self.sem.pause_rate(seconds)
        self.model.pause_rate(self.caller, max(1, round(seconds * 1000)), now)
        self.handed_over()

    # Status -----------------------------------------------------------------------

    def check(self) -> None:
        """The store's ``status()`` against the model's, field by field."""
        now = self.now()
        real = self.sem.status()
        expected = self.model.status(self.caller, now)
        fields = ("declared_limit", "override", "effective_limit", "draining", "holder_count",
                  "waiter_count", "sent_count", "parked_count", "handed_over_count",
                  "rate_room", "fair_keys_waiting", "fair_grants", "fair_keys_read",
                  "shadow_limit_refusals", "shadow_rate_refusals", "shadow_peak")  # fmt: skip
        got = {name: getattr(real, name) for name in fields}
        wanted = dict(
            declared_limit=expected.recorded_limit,
            override=expected.override,
            effective_limit=expected.effective_limit,
            draining=expected.draining,
            holder_count=expected.holder_count,
            waiter_count=expected.waiter_count,
            sent_count=expected.sent_count,
            parked_count=expected.parked_count,
            handed_over_count=expected.handed_over_count,
            rate_room=expected.rate_room,
            fair_keys_waiting=expected.fair_keys_waiting,
            fair_grants=expected.fair_grants,
            fair_keys_read=len(self.model.fair),
            shadow_limit_refusals=expected.shadow_limit_refusals,
            shadow_rate_refusals=expected.shadow_rate_refusals,
            shadow_peak=expected.shadow_peak,
        )
        assert got == wanted
        holders = {h.holder: (h.permits, h.info) for h in real.holders}
        assert holders == {h.holder: (h.permits, h.info) for h in expected.holders}
        modelled = {h.holder: h for h in expected.holders}
        for h in real.holders:
            self.tokens.bind(h.fencing_token, modelled[h.holder].token)
            assert near(h.acquired_at, modelled[h.holder].acquired_ms / 1000)
            assert near(h.expires_at, modelled[h.holder].expires_ms / 1000)
        in_line = [(w.holder, w.info, w.state, w.fair_key) for w in real.waiters]
        states = {"p": "parked", "h": "handed over", "": "asking"}
        assert in_line == [
            (w.holder, w.info, states[w.state], None if w.ask is None else w.ask.fair_key)
            for w in expected.waiters
        ], "the line is not in the model's order"
        for w, row in zip(real.waiters, expected.waiters, strict=True):
            self.tickets.bind(w.ticket, row.ticket)
            assert near(w.since, row.since_ms / 1000)
            assert near(w.expires_at, row.expires_ms / 1000)
        assert [w.holder for w in real.sent_without_place] == expected.sent_without_place
        assert rate_text(real.rate) == rate_text(expected.rate)
        assert rate_text(real.rate_override) == rate_text(expected.rate_override)
        if expected.rate is not None:
            assert real.next_start_at is not None
            assert near(real.next_start_at, expected.next_start_ms / 1000)
        paused = expected.rate_paused_until_ms
        assert near(real.rate_paused_until, paused / 1000 if paused else None)
        fair = [(k.key, k.waiting, k.grants) for k in real.fair_keys]
        assert fair == [(k.key, k.waiting, k.grants) for k in expected.fair_keys]
        assert near(real.shadow_delay, expected.shadow_wait_ms / 1000)
        recorded = {"l": "limit", "r": "rate"}
        assert real.shadow == frozenset(recorded[c] for c in expected.recorded_shadow)
