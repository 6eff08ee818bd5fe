"""One semaphore, in memory: the state the Redis keys hold and the rules the scripts
apply to it, each rule once (see the package docstring for what is covered).

Every operation takes the time, ``now_us``, as an argument: the model has no clock of
its own. An operation is one script call: it reads the time once, as begin() does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import rate as gcra
from . import reading
from .order import (
    PLAIN_ASKED,
    Asked,
    FairKey,
    Placed,
    fair_head,
    place_fair,
    priority_ticket,
    roll_minute,
    seq_after,
    stored,
)
from .parking import Arrival, Dispatch, Handover, ParkIfFar, Parking, State, window
from .rate import NO_ROOM_LIMIT, Rate, Room
from .replies import (
    NOTHING,
    Caller,
    Declared,
    Enqueued,
    Granted,
    ParkedPlace,
    Refused,
    Stale,
    Status,
)


@dataclass
class Holding:
    """A holder (holders + hinfo): its fencing token, when it was first granted, its
    lease's end, the permits it holds (its seats), what it said of itself."""

    token: int
    acquired_ms: int
    expires_ms: int
    permits: int
    info: str


@dataclass
class Waiting:
    """A waiter (waiters + wexp + winfo): its ticket, its waiter lease's end, when it
    first asked, what it said of itself."""

    ticket: int
    expires_ms: int
    since_ms: int
    info: str


@dataclass(frozen=True)
class Judgement:
    """How the semaphore weighs a contender (admit.lua's weigh_gate()): the waiters
    ``ahead``, the permits held (``count``), the ``free`` permits, the permits and grants
    needed (its own and those of the waiters ahead), the shadow limits that ``would``
    have refused it, and the rate's ``room``."""

    admitted: bool
    ahead: int
    count: int
    free: int
    need_permits: int
    need_grants: int
    would: str
    room: Room


class SemaphoreModel:
    """The reference model of one semaphore (see the package docstring)."""

    def __init__(self) -> None:
        self.holders: dict[str, Holding] = {}
        self.waiters: dict[str, Waiting] = {}
        #: The recorded asks of the waiters that ask for more than the default (meta "w|").
        self.asks: dict[str, Asked] = {}
        self.fair: dict[str, FairKey] = {}
        self.sent: dict[str, int] = {}
        self.recorded_limit: int | None = None
        self.override: int | None = None
        self.draining = False
        self.fence: int | None = None
        self.ticket: int | None = None
        self.recorded_rate: Rate | None = None
        self.rate_override: Rate | None = None
        self.tat: int | None = None
        self.rate_pause_ms: int | None = None
        self.recorded_shadow = ""
        self.fair_clock: int | None = None
        self.fair_joins = 0
        self.fair_low: int | None = None
        self.fair_grants = (0, 0, 0)
        self.shadow_limit_refusals = 0
        self.shadow_rate_refusals = 0
        self.shadow_wait_ms = 0
        self.shadow_peak = 0
        self.parking = Parking()
        #: Permits released or reclaimed so far (meta.released: a parked waiter's mark).
        self.released = 0
        #: The moving average of hold times, ms (meta.hold_ms; None before a release).
        self.hold_ms: int | None = None
        #: Whether a weighted waiter was ever recorded (meta.n_weighted exists).
        self.weighted_ever = False
        #: The parked waiters the last call handed over (its reply's handovers).
        self.handovers: list[Handover] = []

    # The limits -----------------------------------------------------------------

    def effective_limit(self, declared: int | None) -> int:
        """The runtime override if set, else the caller's declared limit, else the
        recorded one (the last acquirer's), else 0 (effective_limit() in lua/common_meta.lua).

        Why: two clients that declare different limits are each obeyed by their own
        calls; the override is the operator's, above both."""
        for limit in (self.override, declared, self.recorded_limit):
            if limit is not None:
                return limit
        return 0

    def effective_rate(self, declared: Rate | Declared | None) -> Rate | None:
        """The rate override if set, else the caller's (acquire and enqueue always
        declare one, None for none), else the recorded one (effective_rate() in
        lua/common_rates.lua)."""
        if self.rate_override is not None:
            return self.rate_override
        return self.recorded_rate if declared is NOTHING else declared

    def room(self, declared: Rate | Declared | None, now_us: int) -> Room:
        """The grants the effective rate allows now (see `rate.rate_room`)."""
        return gcra.rate_room(self.effective_rate(declared), self.tat, self.rate_pause_ms, now_us)

    def permits_held(self) -> int:
        """The permits in use: a holder of k permits counts k (ZCARD holders)."""
        return sum(h.permits for h in self.holders.values())

    # The line -------------------------------------------------------------------

    def line(self) -> list[str]:
        """The waiters in line order: by ticket, and equal tickets (a ticket presented
        by two contenders) by holder id, byte by byte, as a Redis sorted set orders them."""
        return sorted(self.waiters, key=lambda h: (self.waiters[h].ticket, h.encode()))

    def ahead_of(self, ticket: int) -> list[str]:
        """The waiters with a lower ticket: only they go first (ZCOUNT '(ticket')."""
        return [h for h in self.line() if self.waiters[h].ticket < ticket]

    def ask_of(self, waiter: str) -> Asked:
        return self.asks.get(waiter, PLAIN_ASKED)

    def place(self, ask: Asked, now_us: int) -> Placed:
        """Where a new ticket for ``ask`` goes, without taking it (place_ticket()): the
        next in time, moved by priority, or, with a fair key, at that key's turn."""
        seq = seq_after(self.ticket, now_us)
        if ask.fair_key is None:
            return Placed(ticket=priority_ticket(seq, ask.priority), seq=seq)
        head = fair_head([self.waiters[h].ticket for h in self.line()], seq, self.fair_clock)
        return place_fair(
            ask.fair_key, ask, seq=seq, head=head, record=self.fair.get(ask.fair_key),
            joins=self.fair_joins, low_seen=self.fair_low,
        )  # fmt: skip

    def new_ticket(self, ask: Asked, now_us: int) -> int:
        """Takes the ticket `place` finds: the ticket sequence moves on (by time, not by
        the priority's move), and with a fair key so do its tail and the fair clock."""
        placed = self.place(ask, now_us)
        self.ticket = placed.seq
        if placed.key is not None and placed.record is not None:
            self.put_fair(placed.key, placed.record, existed=placed.existed, keep=True)
            self.fair_clock = placed.head
            self.fair_low = placed.low
        return placed.ticket

    def put_fair(self, key: str, record: FairKey, *, existed: bool, keep: bool = False) -> None:
        """Writes a key's record, or drops it when none of its waiters is left (``keep``:
        not yet, its new waiter is counted when it stands in line). A key that leaves
        the rotation starts afresh when it comes back: a new tie, a tail from the head."""
        if record.waiting <= 0 and not keep:
            self.fair.pop(key, None)
            return
        if not existed:
            self.fair_joins += 1
        self.fair[key] = record

    def count_fair(self, key: str, delta: int) -> None:
        """``delta`` more (or fewer) waiters of ``key`` (count_fair())."""
        record = self.fair.get(key)
        before = record or FairKey()
        self.put_fair(
            key, replace(before, waiting=max(0, before.waiting + delta)), existed=record is not None
        )

    def count_fair_grant(self, ask: Asked, now_ms: int) -> None:
        """A grant to a waiter of a fair key is counted for status, per minute, in its
        key's record (while it has one) and for all keys (count_fair_grant())."""
        record = None if ask.fair_key is None else self.fair.get(ask.fair_key)
        if ask.fair_key is None or record is None:
            return
        grants, minute, before = roll_minute(
            record.grants, record.minute, record.grants_before, now_ms
        )
        counted = replace(record, grants=grants + 1, minute=minute, grants_before=before)
        self.put_fair(ask.fair_key, counted, existed=True)
        grants, minute, before = roll_minute(*self.fair_grants, now_ms)
        self.fair_grants = (grants + 1, minute, before)

    def weigh_waiter(self, waiter: str, ask: Asked) -> None:
        """Records a waiter's ask while it is in line, if it is not the default, and
        counts it in its fair key; a changed ask replaces the old one (weigh_waiter())."""
        if ask.is_default:
            self.unweigh(waiter)
            return
        old = self.asks.get(waiter)
        if old is not None and old.text == ask.text:
            return
        if old is not None:
            self.unweigh(waiter)
        self.asks[waiter] = ask
        self.weighted_ever = True
        if ask.fair_key is not None:
            self.count_fair(ask.fair_key, 1)

    def unweigh(self, waiter: str) -> None:
        """Drops a waiter's recorded ask and counts it out of its fair key (unweigh())."""
        ask = self.asks.pop(waiter, None)
        if ask is not None and ask.fair_key is not None:
            self.count_fair(ask.fair_key, -1)

    def stand_in_line(
        self, holder: str, ticket: int, *, lease_ms: int, info: str, ask: Asked | None, now_ms: int
    ) -> None:
        """Puts ``holder`` in line at ``ticket`` for ``lease_ms``, keeping when it first
        asked (stand_in_line()): a place is kept only by asking again within the lease.
        ``ask`` None keeps the recorded one (a parking that names none)."""
        if ask is not None:
            self.weigh_waiter(holder, ask)
        since = self.waiters[holder].since_ms if holder in self.waiters else now_ms
        self.waiters[holder] = Waiting(ticket, now_ms + lease_ms, since, info)

    def leave_line(self, holder: str, fate: str | None = None, now_ms: int = 0) -> bool:
        """Takes ``holder`` out of the line; whether it was in. Its parked record's
        ``fate``: "forget" (its place lapsed, it was released or revoked), "served" (it
        holds a permit now: `Parking.served`), or None (it arrived by a handover: its
        record is a tombstone already)."""
        left = self.waiters.pop(holder, None) is not None
        if left:
            self.unweigh(holder)
        if fate == "forget":
            self.parking.forget(holder)
        elif fate == "served":
            self.parking.served(holder, now_ms)
        return left

    # Leases ---------------------------------------------------------------------

    def reclaim(self, now_ms: int) -> int:
        """Drops the holders and waiters whose leases ran out (an end at ``now_ms`` has
        run out); how many went. Every call that changes state does this first
        (reclaim()), so a lease that ran out frees its permits and its place at the next
        call, whoever makes it. (The scripts drop at most 1,000 of each per call.)"""
        gone = [h for h, holding in self.holders.items() if holding.expires_ms <= now_ms]
        for holder in gone:
            self.released += self.holders.pop(holder).permits
        lapsed = [w for w, waiting in self.waiters.items() if waiting.expires_ms <= now_ms]
        for waiter in lapsed:
            self.leave_line(waiter, "forget")
        return len(gone) + len(lapsed)

    # Operations -----------------------------------------------------------------

    def record(self, caller: Caller) -> None:
        """An acquirer records its limit, rate and shadow limits: what callers that
        declare none go by (open_gate())."""
        self.recorded_limit = caller.limit
        self.recorded_rate = caller.rate
        self.recorded_shadow = caller.shadow

    def judge(
        self, caller: Caller, ask: Asked, ticket: int, *, held: bool, now_us: int
    ) -> Judgement:
        """Whether the contender at ``ticket`` is admitted (weigh_gate()): a live holder
        always (it is granted again); else FIFO with weights: the permits and grants of
        the waiters ahead and its own must all fit in the free permits and the rate's
        room (fit(): a heavy waiter at the head holds back those behind it). Draining
        admits nobody new. A shadow limit that would refuse it admits it and says so.

        (The waiters' weights ahead are summed only while so many could fit at all;
        past that each counts one. Only a rate's slot, not the outcome, shows it.)"""
        ahead = self.ahead_of(ticket)
        count = self.permits_held()
        free = 0 if self.draining else self.effective_limit(caller.limit) - count
        room = self.room(caller.rate, now_us)
        need_k, need_j = len(ahead), len(ahead)
        if ahead and len(ahead) < max(free, 0 if room.grants == gcra.UNBOUNDED else room.grants):
            need_k = sum(self.ask_of(w).permits for w in ahead)
            need_j = sum(self.ask_of(w).grants for w in ahead)
        need_k, need_j = need_k + ask.permits, need_j + ask.grants
        by_limit, by_rate, would = need_k <= free, need_j <= room.grants, ""
        if not held and not self.draining:
            if not by_limit and "l" in caller.shadow:
                by_limit, would = True, "l"
            if not by_rate and "r" in caller.shadow:
                by_rate, would = True, would + "r"
        return Judgement(
            held or (by_limit and by_rate), len(ahead), count, free, need_k, need_j, would, room
        )

    def attempt(
        self,
        caller: Caller,
        holder: str,
        now_us: int,
        *,
        lease_ms: int,
        waiter_lease_ms: int,
        ticket: int | None = None,
        ask: Asked = PLAIN_ASKED,
        info: str = "",
        handover: int | None = None,
    ) -> Granted | Refused | Stale:
        """Take a permit, or take or keep a place in line (acquire.lua); never blocks.

        The contender's ticket is its place in line, or the ``ticket`` it presents if
        that is earlier; a new contender is weighed where its new ticket would go, and
        takes it only if refused while queueing (``waiter_lease_ms`` > 0: its place
        holds that long; 0: it keeps no new place and is told ticket 0). ``handover``:
        the token of the handed-over copy this is; a stale copy changes nothing.
        Asking in person drops a payload it parked (it must not come twice)."""
        now_ms = now_us // 1000
        self.handovers = []
        if handover is not None and self.parking.arrive(holder, handover, now_ms) is Arrival.STALE:
            return Stale(self.parking.records[holder].token)
        self.sent.pop(holder, None)
        reclaimed = self.reclaim(now_ms)
        self.record(caller)
        holding = self.holders.get(holder)
        in_line = self.waiters.get(holder)
        parked = self.parking.state_of(holder) is State.PARKED
        if in_line is not None and handover is None and parked:
            self.parking.forget(holder)
        place = None if in_line is None else in_line.ticket
        if ticket is not None and (place is None or ticket < place):
            place = ticket
        weigh_at = place if place is not None else self.place(ask, now_us).ticket
        judged = self.judge(caller, ask, weigh_at, held=holding is not None, now_us=now_us)
        if judged.admitted:
            result: Granted | Refused = self.grant(
                caller, holder, ask=ask, judged=judged, holding=holding, in_line=in_line,
                info=info, lease_ms=lease_ms, now_us=now_us, handover=handover,
            )  # fmt: skip
        else:
            result = self.refuse(
                caller, holder, place, ask=ask, judged=judged, info=info,
                waiter_lease_ms=waiter_lease_ms, now_us=now_us,
            )  # fmt: skip
        binds = judged.room.grants != gcra.UNBOUNDED and "r" not in caller.shadow
        if reclaimed or (isinstance(result, Granted) and binds):
            # What follows freed capacity; or, after a grant under a rate, the waiters
            # of the next slots (finish_gate()).
            self.handovers = self.dispatch_due(
                caller.dispatch, now_us, limit=caller.limit, rate=caller.rate, shadow=caller.shadow
            )
        return result

    def refuse(
        self,
        caller: Caller,
        holder: str,
        place: int | None,
        *,
        ask: Asked,
        judged: Judgement,
        info: str,
        waiter_lease_ms: int,
        now_us: int,
    ) -> Refused:
        """Not granted (refuse_gate()): queueing, it stands in line at its place (a new
        ticket if it had none); the reply says where it stands and what it waits for."""
        now_ms = now_us // 1000
        if waiter_lease_ms > 0 and place is None:
            place = self.new_ticket(ask, now_us)
        queued = 0
        if waiter_lease_ms > 0 and place is not None:
            self.stand_in_line(
                holder, place, lease_ms=waiter_lease_ms, info=info, ask=ask, now_ms=now_ms
            )
            queued = place
        rate = self.effective_rate(caller.rate)
        pause = self.rate_pause_ms or 0
        return Refused(
            ticket=queued,
            position=judged.ahead + 1,
            holders=judged.count,
            limit=self.effective_limit(caller.limit),
            draining=self.draining,
            earliest_expiry_ms=min((h.expires_ms for h in self.holders.values()), default=0),
            slot_us=None
            if rate is None
            else judged.room.slot_in(rate.interval_us, judged.need_grants),
            rate_pause_ms=pause if rate is not None and pause > now_ms else 0,
        )

    def grant(
        self,
        caller: Caller,
        holder: str,
        *,
        ask: Asked,
        judged: Judgement,
        holding: Holding | None,
        in_line: Waiting | None,
        info: str,
        lease_ms: int,
        now_us: int,
        handover: int | None,
    ) -> Granted:
        """Grants the permit (grant_gate()): a new fencing token every time, even to a
        live holder asking again (same permits, same first grant time, no rate spent);
        a waiter leaves the line; the rate's schedule moves on by the grants it asked
        for (a shadow rate's too: its lateness is what it counts)."""
        now_ms = now_us // 1000
        token = seq_after(self.fence, now_us)
        self.fence = token
        waited = 0
        if in_line is not None:
            self.count_fair_grant(self.ask_of(holder), now_ms)
            waited = now_ms - in_line.since_ms
            self.leave_line(holder, "served" if handover is None else None, now_ms)
        rate = self.effective_rate(caller.rate)
        if holding is None and rate is not None:
            self.tat = gcra.spend(rate, self.tat, ask.grants, now_us)
        permits = ask.permits if holding is None else holding.permits
        acquired = now_ms if holding is None else holding.acquired_ms
        self.holders[holder] = Holding(token, acquired, now_ms + lease_ms, permits, info)
        late_ms = 0
        if "l" in judged.would:
            self.shadow_limit_refusals += 1
            self.shadow_peak = max(self.shadow_peak, judged.count + permits)
        if "r" in judged.would and rate is not None:
            late_ms = math.ceil(judged.room.slot_in(rate.interval_us, judged.need_grants) / 1000)
            self.shadow_rate_refusals += 1
            self.shadow_wait_ms += late_ms
        return Granted(token, now_ms + lease_ms, waited, judged.would, late_ms)

    def take_place(
        self,
        caller: Caller,
        holder: str,
        now_us: int,
        *,
        waiter_lease_ms: int,
        ask: Asked = PLAIN_ASKED,
        info: str = "",
        park_if_far: ParkIfFar | None = None,
    ) -> Enqueued:
        """Take a place in line without asking for a permit (enqueue.lua): the ticket
        already held, or a new one; the place holds ``waiter_lease_ms`` from now either
        way. It records the caller's limit (and shadow limits) only where none is
        recorded, and counts the place as sent until its holder first asks.

        With ``park_if_far``, a place whose turn is far is parked at once instead (one
        call where a publisher would take a place, then park): far when draining, or
        when the rate's slot is further than the window, or when at least (free permits
        + limit) waiters are ahead (only the limits that bind count). It then holds the
        park lease, is not counted as sent, and what is due is handed over."""
        now_ms = now_us // 1000
        self.handovers = []
        self.reclaim(now_ms)
        if self.recorded_limit is None:
            self.recorded_limit = caller.limit
            if caller.shadow:
                self.recorded_shadow = caller.shadow
        waiting = self.waiters.get(holder)
        new = waiting is None
        if waiting is None:
            waiting = Waiting(self.new_ticket(ask, now_us), 0, now_ms, info)
            self.waiters[holder] = waiting
        ahead = self.ahead_of(waiting.ticket)
        self.weigh_waiter(holder, ask)
        rate = self.effective_rate(caller.rate)
        room = self.room(caller.rate, now_us)
        slot = None
        if rate is not None:
            grants = sum(self.ask_of(w).grants for w in ahead) + ask.grants
            slot = room.slot_in(rate.interval_us, grants)
        held = self.permits_held()
        reply = Enqueued(
            waiting.ticket, len(ahead) + 1, held, self.effective_limit(caller.limit),
            self.draining, slot,
        )  # fmt: skip
        if park_if_far is not None:
            binding = math.inf if "l" in caller.shadow else self.effective_limit(caller.limit)
            binds = room.grants != gcra.UNBOUNDED and "r" not in caller.shadow
            far = (
                self.draining
                or (binds and slot is not None and slot > park_if_far.window_us)
                or len(ahead) >= max(0, binding - held) + binding
            )
            if far:
                waiting.expires_ms = now_ms + park_if_far.park_lease_ms
                self.sent.pop(holder, None)
                self.parking.leave_payload(
                    holder, park_if_far.head + str(waiting.ticket) + park_if_far.tail,
                    released=self.released, due_ms=park_if_far.due_ms, now_ms=now_ms,
                )  # fmt: skip
                self.handovers = self.dispatch_due(
                    park_if_far.dispatch, now_us, limit=None, rate=caller.rate,
                    shadow=caller.shadow,
                )  # fmt: skip
                return replace(reply, parked=True)
        if new:
            self.sent.setdefault(holder, now_ms)
        waiting.expires_ms = now_ms + waiter_lease_ms
        return reply

    def release(
        self, caller: Caller, holder: str, now_us: int, token: int | None = None, *, unused: int = 0
    ) -> bool:
        """Give a permit back (release.lua); whether one was released. Idempotent: a
        second release, an unknown or reclaimed holder, or a stale ``token`` releases
        nothing. Without a token (by id: a worker that lost the child) it also drops the
        holder's place in line. ``unused``: the permit's task never started, so the
        rate's grants it spent are given back too. Then, if anything was freed and
        someone waits, what follows freed capacity (handovers)."""
        now_ms = now_us // 1000
        self.handovers = []
        reclaimed = self.reclaim(now_ms)
        waiting = len(self.waiters)
        holding = self.holders.get(holder)
        released = holding is not None and (token is None or holding.token == token)
        if holding is not None and released:
            del self.holders[holder]
            self.note_hold(now_ms - holding.acquired_ms)
            self.released += holding.permits
            rate = self.effective_rate(NOTHING)
            if unused > 0 and rate is not None and self.tat is not None:
                self.tat = gcra.give_back(rate, self.tat, unused)
        left = False
        if token is None:
            self.sent.pop(holder, None)
            left = waiting > 0 and self.leave_line(holder, "forget")
        if (released or reclaimed or left) and waiting > 0:
            self.handovers = self.dispatch_due(
                caller.dispatch, now_us, limit=caller.limit, rate=NOTHING, shadow=caller.shadow
            )
        return released

    def note_hold(self, held_ms: int) -> None:
        """The moving average of hold times (meta.hold_ms): what dispatch() takes as the
        pace of the line (0.8 x the last average + 0.2 x this hold)."""
        average = self.hold_ms
        self.hold_ms = stored(held_ms if average is None else 0.8 * average + 0.2 * held_ms)

    def renew(
        self,
        holders: list[tuple[str, int | None]],
        lease_ms: int,
        now_us: int,
        *,
        dispatch: Dispatch | None = None,
    ) -> tuple[int, list[str]]:
        """Compare-and-extend (renew.lua): each (holder, token) still live with that
        token (None: any) gets a lease of ``lease_ms`` from now; the others are lost.
        A lease that already ran out is reclaimed first: a renew never resurrects."""
        now_ms = now_us // 1000
        self.handovers = []
        reclaimed = self.reclaim(now_ms)
        lost = []
        for holder, token in holders:
            holding = self.holders.get(holder)
            if holding is not None and (token is None or holding.token == token):
                holding.expires_ms = now_ms + lease_ms
            else:
                lost.append(holder)
        if reclaimed:
            self.handovers = self.dispatch_due(dispatch, now_us, limit=None, rate=NOTHING)
        return now_ms + lease_ms, lost

    # Settings (configure.lua): each answers the previous value, reclaims, then hands
    # over what is due (so a raised limit or an ended drain hands over at once) ------

    def configured(self, now_us: int, caller: Caller | None) -> None:
        self.reclaim(now_us // 1000)
        rate = NOTHING if caller is None or caller.rate is None else caller.rate
        cfg = None if caller is None else caller.dispatch
        self.handovers = self.dispatch_due(cfg, now_us, limit=None, rate=rate)

    def set_override(
        self, limit: int | None, now_us: int, caller: Caller | None = None
    ) -> int | None:
        """The runtime limit for every client (None clears it). Lowering it evicts
        nobody: it admits nobody until the holders drop below it."""
        previous, self.override = self.override, limit
        self.configured(now_us, caller)
        return previous

    def set_draining(self, draining: bool, now_us: int, caller: Caller | None = None) -> bool:
        """While draining nobody new is admitted (a live holder asking again still is)
        and nobody is handed over; holders finish."""
        previous, self.draining = self.draining, draining
        self.configured(now_us, caller)
        return previous

    def set_rate_override(
        self, rate: Rate | None, now_us: int, caller: Caller | None = None
    ) -> Rate | None:
        """The runtime rate for every client (None clears it), from the next grant on.

        It changes the rate, not the schedule: tat stays where the grants made under the
        old rate left it, so a faster rate admits nobody before then (as configure.lua
        does, and docs/operations.md says)."""
        previous, self.rate_override = self.rate_override, rate
        self.configured(now_us, caller)
        return previous

    def pause_rate(self, caller: Caller, ms: int, now_us: int) -> None:
        """The rate grants nothing for ``ms`` from now (a task raised RateLimited); a
        pause that would end sooner than the one set changes nothing, and without a rate
        nothing is paused (and nothing else happens: not even a reclaim)."""
        now_ms = now_us // 1000
        self.handovers = []
        if self.effective_rate(NOTHING if caller.rate is None else caller.rate) is None:
            return
        self.rate_pause_ms = max(now_ms + ms, self.rate_pause_ms or 0)
        self.configured(now_us, caller)

    # Parking and handover (park.lua, dispatch.lua; see parking.py) ------------------

    def park(
        self,
        caller: Caller,
        holder: str,
        payload: str,
        now_us: int,
        *,
        park_lease_ms: int,
        ticket: int | None = None,
        info: str = "",
        due_ms: int = 0,
        ask: Asked | None = None,
    ) -> ParkedPlace:
        """Stay in line without asking: leave ``payload`` to be handed over when due
        (maybe at once), or ``due_ms`` from now at the latest. The place is its own, the
        ticket presented if earlier, or a new one; it holds ``park_lease_ms``. ``ask``
        None keeps the recorded one. The caller declares no limit."""
        now_ms = now_us // 1000
        self.reclaim(now_ms)
        in_line = self.waiters.get(holder)
        place = None if in_line is None else in_line.ticket
        if ticket is not None and (place is None or ticket < place):
            place = ticket
        if place is None:
            place = self.new_ticket(ask or PLAIN_ASKED, now_us)
        self.stand_in_line(holder, place, lease_ms=park_lease_ms, info=info, ask=ask, now_ms=now_ms)
        self.sent.pop(holder, None)
        self.parking.leave_payload(
            holder, payload, released=self.released, due_ms=due_ms, now_ms=now_ms
        )
        position = len(self.ahead_of(place)) + 1
        self.handovers = self.dispatch_due(caller.dispatch, now_us, limit=None, rate=NOTHING)
        return ParkedPlace(place, position)

    def meta_found(self) -> bool:
        """Whether dispatch.lua finds the semaphore's meta: any of the fields that
        after_free() reads. (A semaphore only parked on, never asked, has none: its
        meta holds the ticket sequence and counters only, and reads as gone.)"""
        return (
            self.recorded_limit is not None
            or self.override is not None
            or self.draining
            or self.fence is not None
            or self.released > 0
            or self.hold_ms is not None
            or self.parking.handover is not None
            or self.recorded_rate is not None
            or self.rate_override is not None
            or self.tat is not None
            or self.rate_pause_ms is not None
            or self.weighted_ever
            or self.recorded_shadow != ""
        )

    def dispatch(self, caller: Caller, now_us: int, drop: tuple[str, ...] = ()) -> int:
        """Hand over what is due, after dropping the named waiters that are parked or
        handed over (revoked tasks; one asking in person or holding stays); how many
        were dropped. A semaphore with no meta changes nothing (writing would make it)."""
        self.handovers = []
        if not self.meta_found():
            return 0
        dropped = 0
        for holder in drop:
            if self.parking.state_of(holder) in (State.PARKED, State.HANDED):
                self.leave_line(holder, "forget")
                dropped += 1
        self.reclaim(now_us // 1000)
        self.handovers = self.dispatch_due(caller.dispatch, now_us, limit=None, rate=NOTHING)
        return dropped

    def dispatch_due(
        self,
        cfg: Dispatch | None,
        now_us: int,
        *,
        limit: int | None,
        rate: Rate | Declared | None,
        shadow: str | None = None,
    ) -> list[Handover]:
        """The parked waiters now due, handed over (dispatch()): for a caller that
        publishes (``cfg``), among the first waiters of the line (`parking.window`), a
        parked one whose permits and grants, with those ahead, fit in the free permits
        and the rate's room, or one parked before the latest release (the line moved:
        its turn is near); under a rate, the first one past the rate's window is handed
        over with a delay that brings it at its slot (at most the deadline ahead), and
        no one after it. Then those handed over that did not arrive by their deadline
        (again, with a new token), and parked ones whose due time came; a due entry of
        one no longer in line (or an aged tombstone) is forgotten. Only the limits that
        bind count: a shadow limit (``shadow``; None: the recorded ones) moves nobody."""
        if cfg is None or not self.parking.records:
            return []
        now_ms = now_us // 1000
        codes = self.recorded_shadow if shadow is None else shadow
        binding = math.inf if "l" in codes else self.effective_limit(limit)
        room = NO_ROOM_LIMIT if "r" in codes else self.room(rate, now_us)
        in_force = None if room.grants == gcra.UNBOUNDED else self.effective_rate(rate)
        due = window(binding, self.permits_held(), paused=self.draining, hold_ms=self.hold_ms or 0,
                     room=room, rate=in_force, cfg=cfg)  # fmt: skip
        paused = in_force is not None and (self.rate_pause_ms or 0) > now_ms
        out = []
        k = j = 0
        for holder in self.line()[: int(due.count)]:
            k, j = k + self.ask_of(holder).permits, j + self.ask_of(holder).grants
            record = self.parking.records.get(holder)
            parked = record is not None and record.state is State.PARKED
            progress = parked and record is not None and record.mark < self.released
            slot_ms = 0
            if in_force is not None:
                slot_ms = math.ceil(room.slot_in(in_force.interval_us, j) / 1000)
            if slot_ms > due.rate_window_ms or paused:
                if parked and (k <= due.permits or progress) and slot_ms <= cfg.deadline_ms:
                    out.append(self.hand_over(holder, cfg, slot_ms, now_us))
                break
            if parked and ((k <= due.permits and j <= room.grants) or progress):
                out.append(self.hand_over(holder, cfg, 0, now_us))
        for holder in self.parking.late(now_ms):
            state = self.parking.state_of(holder)
            if state in (State.HANDED, State.PARKED) and holder in self.waiters:
                out.append(self.hand_over(holder, cfg, 0, now_us))
            else:
                self.parking.forget(holder)
        return out

    def hand_over(self, holder: str, cfg: Dispatch, delay_ms: int, now_us: int) -> Handover:
        payload = self.parking.records[holder].payload
        return self.parking.hand_over(holder, payload, cfg=cfg, delay_ms=delay_ms, now_us=now_us)

    # Reading ----------------------------------------------------------------------

    def status(self, caller: Caller, now_us: int) -> Status:
        """What status.lua reads (see `reading.status`)."""
        return reading.status(self, caller, now_us)
