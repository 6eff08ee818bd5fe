"""One operation, two semaphores: a store's (through the public `Semaphore` API) and
the reference model's (`celery_semaphore.core.model`), compared reply by reply.

A store is anything that makes `Semaphore`-like objects and tells its clock
(`Store`): the Redis stores in ``conftest.py``; a future store passes the same suite
by providing one. The model is the oracle: it is given the store's clock, read just
before each call, so the two see nearly the same times; where a value is the clock
itself (tickets, tokens, slots), the comparison is of orders (tickets and tokens are
bound one to one, and every new pair must sit in the same order among all pairs
seen) or within `CLOCK_SLACK`, never of raw µs.

A store that publishes wake messages (Redis) is also heard: `WakeChannel` subscribes to
the semaphore's wake channel, and every call's messages are compared with what the
model says it published (`SemaphoreModel.published`). `lose_data` makes a store lose a
namespace's data between calls, as a restart without persistence would; `PairSet`
drives several semaphores taken at once (`SemaphoreSet`) against `model.acquire_all`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from celery_semaphore import (
    Handover,
    Permit,
    Place,
    Places,
    RateLimit,
    SemaphoreSet,
    StaleHandover,
)
from celery_semaphore.core import Claimed, model
from celery_semaphore.core.constants import (
    HISTOGRAMS,
    KEPT,
    KEPT_PREFIX,
    RELEASED,
    histogram_fields,
)
from celery_semaphore.core.model import Asked, Caller, SemaphoreModel
from celery_semaphore.core.operations import OperatedStore
from celery_semaphore.core.protocol import PAUSE_MARGIN
from celery_semaphore.core.rates import parse_rate
from celery_semaphore.metrics import COUNTED, FAIR_GRANTS, OUTCOMES

#: How far apart a store's time-valued replies (slots, pauses, lateness) may be from the
#: model's: the time between the clock reading given to the model and the store's own.
CLOCK_SLACK = 0.25
#: The metrics' counters the model keeps (`SemaphoreModel.counters`; the shadow ones are
#: status's, compared there).
COUNTERS = (
    *OUTCOMES, *(f for f, _, _ in COUNTED if not f.startswith("m_shadow")), *FAIR_GRANTS,
)  # fmt: skip
LONG = 600.0  # seconds: leases that time plays no part in


class Store(Protocol):
    """What the suite needs of a store: semaphores of it, and its clock."""

    name: str

    def semaphore(self, limit: int | None, **options: Any) -> Any:
        """A new semaphore (a fresh name) of this store, as `Semaphore(url, name, limit,
        **options)` makes one."""

    def now_us(self) -> int:
        """The store's clock, in µs: the time its operations read."""

    def operated(self) -> OperatedStore:
        """Its operators' side, as the metrics read it (closed with the store)."""

    def close(self) -> None:
        """Close its semaphores and connections (again: nothing)."""


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


class WakeChannel:
    """What a store publishes on a semaphore's wake channel, heard call by call: after
    each call the driver publishes on a channel of its own to the same subscriber, so
    every message before that one is the call's (Redis delivers a subscriber's
    messages in the order the server published them)."""

    def __init__(self, client: Any, channel: str) -> None:
        self.client = client
        self.channel = channel
        self.mark = f"{channel}:conformance-mark"
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(channel, self.mark)

    def heard(self) -> list[str]:
        """The messages published on the wake channel since the last call."""
        self.client.publish(self.mark, "")
        messages: list[str] = []
        deadline = time.monotonic() + 2.0
        while True:
            # None: nothing yet, or a subscribe confirmation (ignored).
            message = self.pubsub.get_message(timeout=0.1)
            assert time.monotonic() < deadline, "the wake channel's mark never came"
            if message is None:
                continue
            channel = message["channel"]
            if (channel.decode() if isinstance(channel, bytes) else channel) == self.mark:
                return messages
            data = message["data"]
            messages.append(data.decode() if isinstance(data, bytes) else str(data))

    def close(self) -> None:
        self.pubsub.close()


class NotifyChannel:
    """What the PostgreSQL store NOTIFYs on a semaphore's channel, heard call by call as
    `WakeChannel` hears Redis: a mark NOTIFY on a channel of its own ends each call's
    messages (PostgreSQL delivers a listener's notifications in commit order)."""

    def __init__(self, url: str, channel: str) -> None:
        import psycopg

        self.connection = psycopg.connect(url, autocommit=True)
        self.channel = channel
        self.mark = f"{channel}_mark"
        self.connection.execute(f'LISTEN "{channel}"')
        self.connection.execute(f'LISTEN "{self.mark}"')

    def heard(self) -> list[str]:
        self.connection.execute("SELECT pg_notify(%s, '')", (self.mark,))
        messages: list[str] = []
        for notify in self.connection.notifies(timeout=2.0):
            if notify.channel == self.mark:
                return messages
            messages.append(notify.payload)
        raise AssertionError("the channel's mark never came")

    def close(self) -> None:
        self.connection.close()


def wake_channel(sem: Any) -> WakeChannel | NotifyChannel | None:
    """The wake channel of ``sem``'s store, if it has one (Redis, PostgreSQL)."""
    from celery_semaphore.core.postgres._sync.store import PostgresStore, channel_of

    if isinstance(sem.store, PostgresStore):
        return NotifyChannel(sem.store.target, channel_of(sem._spec))
    try:
        client = sem.client
    except AttributeError:
        return None
    return WakeChannel(client, sem.keys.channel)


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
        namespace: str | None = None,
        pause_after_loss: float | None = None,
        listen: bool = False,
    ) -> None:
        self.store = store
        #: What the store handed over during the current call (its on_handover).
        self.received: list[Handover] = []
        #: The store's clock read for the latest call (what the model was given).
        self.model_now = 0
        #: What the latest call published on the wake channel (when listening).
        self.last_heard: list[str] = []
        publishing: dict[str, Any] = {}
        dispatch = None
        if handover_window is not None:
            publishing = dict(
                on_handover=self.received.extend, handover_window=handover_window,
                handover_deadline=handover_deadline,
            )  # fmt: skip
            dispatch = model.Dispatch(int(handover_window * 1000), int(handover_deadline * 1000))
        if namespace is not None:
            publishing["namespace"] = namespace
        self.sem = sem or store.semaphore(
            limit, rate=rate, shadow=shadow, fair_weights=fair_weights,
            lease_timeout=lease, waiter_lease=waiter_lease, pause_after_loss=pause_after_loss,
            **publishing,
        )  # fmt: skip
        self.model = model_of or SemaphoreModel()
        pause = lease / 4 + PAUSE_MARGIN if pause_after_loss is None else pause_after_loss
        self.caller = Caller(
            limit=self.sem.limit,
            rate=model_rate(self.sem.rate),
            shadow=("l" if "limit" in shadow else "") + ("r" if "rate" in shadow else ""),
            dispatch=dispatch,
            pause_ms=max(1, int(pause * 1000)),
        )
        #: The store's wake channel, heard after every call (None: not listening).
        self.wakes = wake_channel(self.sem) if listen else None
        if listen and self.wakes is None:
            pytest.skip(
                f"the {store.name} store's wake messages are the model's own (no channel "
                "to listen to): nothing to compare"
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
        other.wakes = self.wakes
        return other

    def close(self) -> None:
        if self.wakes is not None:
            self.wakes.close()

    def now(self) -> int:
        """The store's clock for the call about to be made (and a clean slate for what
        the call hands over)."""
        self.received.clear()
        self.model_now = self.store.now_us()
        return self.model_now

    def in_store_terms(self, holder: str, payload: str) -> str:
        """A payload the model made around its ticket (take_place_or_park), with the
        store's ticket for it instead. The ticket it was made with, not the waiter's
        ticket now: a claim's swap gives the waiter another one, not another payload."""
        waiting = self.model.waiters.get(holder)
        candidates = [] if waiting is None else [waiting.ticket]
        candidates += sorted(self.tickets.to_store, reverse=True)
        for ticket in candidates:
            if ticket in self.tickets.to_store and str(ticket) in payload:
                return payload.replace(str(ticket), str(self.tickets.to_store[ticket]))
        return payload

    def handed_over(self) -> list[Handover]:
        """The call's handovers, the store's against the model's: the same waiters in the
        same order, with their payloads, delays, and tokens in the model's order (and,
        when listening, what the call published: `heard`)."""
        self.heard()
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

    def heard(self) -> list[str]:
        """The call's wake messages against the model's `published`: the same grants in
        place (holder, fencing token in the model's order, lease end, wait) and the
        same wake-ups (the highest admissible ticket, in the model's order, or "inf")."""
        if self.wakes is None:
            return []
        got = self.last_heard = self.wakes.heard()
        expected = self.model.published
        assert len(got) == len(expected), (got, expected)
        for message, said in zip(got, expected, strict=True):
            if isinstance(said, model.Recall):
                assert message == "k", (message, said)
                continue
            if isinstance(said, model.WakeUp):
                assert (message == "inf") == (said.ticket is None), (message, said)
                if said.ticket is not None:
                    self.tickets.bind(int(float(message)), said.ticket)
                continue
            code, holder, token, expires_ms, waited_ms = message.split("|")
            assert (code, holder) == ("g", said.holder), (message, said)
            self.tokens.bind(int(token), said.token)
            assert near(int(expires_ms) / 1000, said.expires_ms / 1000)
            assert near(int(waited_ms) / 1000, said.waited_ms / 1000)
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
        in_place: bool = False,
    ) -> Permit | Place | None:
        """``ticket``: a ticket the store gave (the model gets its own for it); so is
        ``handover``, a handover token. None: the copy was stale (StaleHandover).
        ``in_place``: refused, it waits in place (only where the driver listens)."""
        assert self.wakes is not None or not in_place, "in_place needs a pair made with listen="
        result: Permit | Place | None
        modelled_ticket = None if ticket is None else self.tickets.to_model[ticket]
        modelled_handover = None if handover is None else self.handover_tokens.to_model[handover]
        now = self.now()
        try:
            result = self.sem.attempt(
                holder, ticket, queue=queue, weight=weight, rate_weight=rate_weight,
                priority=priority, fair_key=fair_key, info=info, lease_timeout=lease,
                handover=handover, in_place=in_place,
            )  # fmt: skip
        except StaleHandover as stale:
            result = None
            latest = stale.token
        expected = self.model.attempt(
            self.caller, holder, now,
            lease_ms=self.lease_ms if lease is None else max(1, int(1000 * lease)),
            waiter_lease_ms=self.waiter_lease_ms if queue else 0,
            ticket=modelled_ticket, ask=self.ask(weight, rate_weight, priority, fair_key),
            info=info, handover=modelled_handover, in_place=in_place,
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
        resumes = expected.resumes_ms
        now_ms = self.model_now // 1000
        assert near(place.resumes_in, (resumes - now_ms) / 1000 if resumes else None), (
            place.resumes_in, resumes - now_ms,
        )  # fmt: skip

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
        self.heard()
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

    def claim(self, taken: str, handed: str, token: int) -> Claimed:
        """The process that got the handover (``handed``, ``token``: a token the store
        gave) took ``taken``'s message from a parking queue. A swap gives ``taken``
        that token: its message is published with it (`copies`)."""
        modelled = self.handover_tokens.to_model[token]
        now = self.now()
        claimed = self.sem.claim(taken, Handover(handed, token, ""))
        expected = self.model.claim(self.caller, taken, handed, modelled, now)
        assert claimed.value == expected.value, (taken, handed, claimed, expected)
        assert self.handed_over() == [], "a claim hands over nobody"
        if claimed is Claimed.PUBLISH and taken != handed:
            self.copies.setdefault(taken, []).append(token)
        return claimed

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

    def keep_permit(self, index: int, kept_as: str, info: str = "") -> Permit | None:
        """The permit's task ended and its process keeps it as ``kept_as`` (`Permit.keep`):
        the kept permit (its index: the last of `permits`), or None if it was released."""
        permit, token, caller = self.permits[index]
        now = self.now()
        result = permit.keep(kept_as, info)
        expected = self.model.keep(caller, permit.holder, now, token=token, kept_as=kept_as,
                                   info=info)  # fmt: skip
        kept = result if isinstance(result, Permit) else None
        assert (kept is not None) is (expected == KEPT), (permit, token, expected)
        if kept is None:
            assert result is (expected == RELEASED), (permit, token, expected)
        self.handed_over()
        if kept is not None:
            assert (kept.holder, kept.fencing_token) == (kept_as, permit.fencing_token)
            self.permits.append((kept, token, caller))
        return kept

    def renew_permit(self, index: int) -> bool:
        permit, token, caller = self.permits[index]
        now = self.now()
        before = permit.semaphore.restored
        renewed = permit.renew()
        _, lost = self.model.renew(
            [(permit.holder, token)], self.lease_ms, now, dispatch=caller.dispatch,
            pause_ms=caller.pause_ms, permits={permit.holder: permit.weight},
        )  # fmt: skip
        assert renewed is (permit.holder not in lost), (permit, token)
        assert permit.semaphore.restored - before == len(self.model.restored)
        self.handed_over()
        return bool(renewed)

    def renew_many(self, holders: list[str], weight: int | None = None) -> set[str]:
        """By holder id (as a worker renews its requests); ``weight``: the permits each
        holds, written back with it after a data loss."""
        now = self.now()
        before = self.sem.restored
        lost = self.sem.renew_many(holders, weight=weight)
        _, expected = self.model.renew(
            [(h, None) for h in holders], self.lease_ms, now, dispatch=self.caller.dispatch,
            pause_ms=self.caller.pause_ms, permits=dict.fromkeys(holders, weight or 1),
        )  # fmt: skip
        assert lost == set(expected)
        assert self.sem.restored - before == len(self.model.restored), "restored"
        self.handed_over()
        return set(lost)

    def learn_epoch(self) -> None:
        now = self.now()
        self.sem.learn_epoch()
        self.model.learn_epoch(self.caller.pause_ms, now)
        self.heard()

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
        states = {"p": "parked", "h": "handed over", "w": "waiting in place", "": "asking"}
        assert in_line == [
            (w.holder, w.info, states[w.state], None if w.ask is None else w.ask.fair_key)
            for w in expected.waiters
        ], "the line is not in the model's order"
        for w, row in zip(real.waiters, expected.waiters, strict=True):
            self.tickets.bind(w.ticket, row.ticket)
            assert near(w.since, row.since_ms / 1000)
            assert near(w.expires_at, row.expires_ms / 1000)
        assert [w.holder for w in real.sent_without_place] == [
            s.holder for s in expected.sent_without_place
        ]
        for w, sent in zip(real.sent_without_place, expected.sent_without_place, strict=True):
            assert near(w.since, sent.sent_ms / 1000)
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
        resumes = expected.resumes_ms
        assert near(real.resumes_at, resumes / 1000 if resumes else None)
        self.check_counters(expected)

    def check_counters(self, expected: Any = None) -> None:
        """What a scrape reads (the store's counts) against the model: the permits in use
        and of them the kept ones (as the model's status, ``expected``, lists them), each
        counter, and how many observations each histogram has (which bucket one falls in
        depends on each side's clock: a wait of 5 ms on one may be 6 on the other)."""
        buckets = {kind: histogram_fields(kind) for kind in HISTOGRAMS}
        fields = [*COUNTERS, *(f for kind in HISTOGRAMS for f in buckets[kind])]
        read = self.store.operated().counts(self.sem.namespace, [self.sem.name], fields)
        if not read:  # no recorded limit (only parked on): the metrics list it not
            assert self.model.recorded_limit is None
            return
        if expected is None:
            expected = self.model.status(self.caller, self.now())
        kept = sum(h.permits for h in expected.holders if h.holder.startswith(KEPT_PREFIX))
        assert (read[0].holder_count, read[0].kept_count) == (expected.holder_count, kept)
        got = {f: int(read[0].fields[f] or 0) for f in fields}
        counted = self.model.counters
        assert {f: got[f] for f in COUNTERS} == {f: counted[f] for f in COUNTERS}
        for kind, names in buckets.items():
            assert sum(got[f] for f in names) == sum(counted[f] for f in names), kind


def lose_data(*pairs: Pair) -> None:
    """The store loses the data of these pairs' semaphores and their namespace's epoch
    hash, as a restart without persistence would (only theirs: other tests share the
    server); the model forgets the same (`SemaphoreModel.lose_data`)."""
    client = wake_client(pairs[0])
    for p in pairs:
        client.delete(*p.sem.keys.script_keys, p.sem.keys.epoch)
    for modelled in {id(p.model): p.model for p in pairs}.values():
        modelled.lose_data()


def wake_client(pair: Pair) -> Any:
    """The Redis client of ``pair``'s store, or skip: a store that cannot lose its data
    between calls (the memory store) has no data loss to test."""
    try:
        return pair.sem.client
    except AttributeError:
        pytest.skip(f"the {pair.store.name} store cannot lose its data between calls")


class PairSet:
    """Several pairs of one store and namespace taken at once: the store's `SemaphoreSet`
    and `model.acquire_all` over the pairs' models (which share one `model.Epochs`, as
    the semaphores share one epoch hash). The pairs share one ticket binding: a refused
    contender's one ticket stands in every line."""

    def __init__(self, pairs: list[Pair]) -> None:
        self.pairs = pairs
        try:
            self.set = SemaphoreSet([p.sem for p in pairs])
        except ValueError as error:
            pytest.skip(f"the {pairs[0].store.name} store takes no set at once: {error}")
        for p in pairs[1:]:
            p.tickets = pairs[0].tickets

    def attempt(
        self,
        holder: str,
        ticket: int | None = None,
        *,
        queue: bool = True,
        hold_back: float = 0.0,
        weights: list[int] | None = None,
        priority: int = 0,
        fair_keys: list[str | None] | None = None,
    ) -> Any:
        first = self.pairs[0]
        modelled_ticket = None if ticket is None else first.tickets.to_model[ticket]
        now = first.now()
        for p in self.pairs[1:]:
            p.received.clear()
        result = self.set.attempt(
            holder, ticket, queue=queue, hold_back=hold_back, weights=weights,
            priority=priority, fair_keys=fair_keys,
        )  # fmt: skip
        keys = fair_keys or [None] * len(self.pairs)
        parts = []
        for i, p in enumerate(self.pairs):
            weight = 1 if weights is None else weights[i]
            ask = p.ask(weight, None, priority, keys[i])
            waiter_ms = p.waiter_lease_ms if queue else 0
            parts.append(model.Part(p.model, p.caller, p.lease_ms, waiter_ms, ask))
        expected = model.acquire_all(
            parts, holder, now, hold_back_ms=int(1000 * hold_back), ticket=modelled_ticket
        )
        for p in self.pairs:
            p.handed_over()
        if isinstance(expected, model.RefusedAll):
            assert isinstance(result, Places), (holder, result, expected)
            assert result.refused_by == expected.refused_by, (result, expected)
            assert (result.ticket == 0) == (expected.ticket == 0), (result, expected)
            if result.ticket:
                first.tickets.bind(result.ticket, expected.ticket)
            for p, place, said in zip(self.pairs, result.places, expected.places, strict=True):
                p.model_now = now
                p.refused(place, said)
            return result
        assert isinstance(expected, list), expected
        assert not hasattr(result, "places"), (holder, result, expected)
        for p, permit, grant in zip(self.pairs, result, expected, strict=True):
            p.granted(permit, grant)
        return result

    def check(self) -> None:
        for p in self.pairs:
            p.check()
