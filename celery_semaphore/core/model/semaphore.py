"""One semaphore, in memory: the state the Redis keys hold and the rules the scripts
apply to it, each rule once (see the package docstring for what is covered).

Every operation takes the time, ``now_us``, as an argument: the model has no clock of
its own. An operation is one script call: it reads the time once and settles the epoch
of the data first, as begin() does (`SemaphoreModel.begin`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from . import kept, places, reading
from . import rate as gcra
from .after_free import dispatch, grant_in_place, wake
from .counters import Counters, weight_class
from .entries import Gate, Holding, Judgement, Waiting
from .epochs import Epochs
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
from .parking import Arrival, Dispatch, Handover, Parking, State
from .rate import Rate, Room
from .replies import (
    NOTHING,
    PAUSE_AFTER_LOSS_MS,
    Caller,
    Claimed,
    Declared,
    Granted,
    Published,
    Recall,
    Refused,
    Stale,
    Status,
)

__all__ = ["Gate", "Holding", "Judgement", "SemaphoreModel", "Waiting"]


class SemaphoreModel:
    """The reference model of one semaphore (see the package docstring). ``epochs``:
    the epoch hash it shares with the other semaphores of its namespace (a set taken
    at once shares one), new if not given."""

    def __init__(self, epochs: Epochs | None = None) -> None:
        self.epochs = epochs or Epochs()
        #: While admissions are paused after a data loss, when they resume (ms; this
        #: call's, set by `begin`), else 0.
        self.resumes_ms = 0
        #: The parked waiters the last call handed over (its reply's handovers).
        self.handovers: list[Handover] = []
        #: What the last call published on the wake channel, in order.
        self.published: list[Published] = []
        #: The holders the last renewal wrote back after a data loss (its ``restored``).
        self.restored: list[str] = []
        self.empty()

    def empty(self) -> None:
        """The semaphore's data as a first use finds it: no key at all."""
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
        #: The metrics' counters and histograms (meta's m_* fields; see counters.py).
        self.counters = Counters()

    # Data loss (lua/common_epoch.lua; see epochs.py) --------------------------------

    def lose_data(self) -> None:
        """Redis loses its data (a restart without persistence, a failover to a replica
        that lagged, a flush): this semaphore's keys and the epoch hash go. The
        processes keep what they knew: the epoch, and the permits their tasks hold."""
        self.empty()
        self.epochs.lose()

    def begin(self, pause_ms: int, now_us: int) -> None:
        """The start of every call (begin()): the epoch settled (`Epochs.begin`; a
        ``pause_ms`` of 0 is a reader's), and a clean slate for what the call tells."""
        self.resumes_ms = self.epochs.begin(pause_ms, now_us)
        self.handovers, self.published, self.restored = [], [], []

    def paused(self) -> bool:
        """Whether nothing may be granted or handed over now (paused()): draining, or
        paused after a data loss until the epoch's resumes_ms.

        Why: while paused the workers write back the permits their tasks hold
        (`renew`), so the line resumes under the limit instead of over it."""
        return self.draining or self.resumes_ms > 0

    def learn_epoch(self, pause_ms: int, now_us: int) -> None:
        """epoch.lua: learn the data epoch now, changing nothing else, so that a loss
        before this process's next call is noticed (a worker does this at start)."""
        self.begin(pause_ms, now_us)

    def note_lost(self, count: int) -> None:
        """Count ``count`` permits found lost by a caller that renews by id (an HINCRBY
        of meta.m_lost, no script: no epoch, no reclaim). A metric no rule reads (nor
        does dispatch.lua look for it when it asks whether meta exists)."""
        self.counters.bump("m_lost", count)

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
        self.counters.bump(f"m_fair_granted_c{weight_class(ask.fair_weight)}")

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
        ``ask`` None keeps the recorded one (a parking that names none). The first
        waiter of an empty line publishes `Recall`: kept permits go back."""
        if not self.waiters:
            self.published.append(Recall())
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
        self.counters.bump("m_expired", len(gone))
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
        room (fit(): a heavy waiter at the head holds back those behind it). While
        paused (draining, or after a data loss) nobody new is admitted. A shadow limit
        that would refuse it admits it and says so.

        (The waiters' weights ahead are summed only while so many could fit at all;
        past that each counts one. Only a rate's slot, not the outcome, shows it.)"""
        ahead = self.ahead_of(ticket)
        count = self.permits_held()
        free = 0 if self.paused() else self.effective_limit(caller.limit) - count
        room = self.room(caller.rate, now_us)
        need_k, need_j = len(ahead), len(ahead)
        if ahead and len(ahead) < max(free, 0 if room.grants == gcra.UNBOUNDED else room.grants):
            need_k = sum(self.ask_of(w).permits for w in ahead)
            need_j = sum(self.ask_of(w).grants for w in ahead)
        need_k, need_j = need_k + ask.permits, need_j + ask.grants
        by_limit, by_rate, would = need_k <= free, need_j <= room.grants, ""
        if not held and not self.paused():
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
        in_place: bool = False,
    ) -> Granted | Refused | Stale:
        """Take a permit, or take or keep a place in line (acquire.lua); never blocks.

        The contender's ticket is its place in line, or the ``ticket`` it presents if
        that is earlier; a new contender is weighed where its new ticket would go, and
        takes it only if refused while queueing (``waiter_lease_ms`` > 0: its place
        holds that long; 0: it keeps no new place and is told ticket 0). ``handover``:
        the token of the handed-over copy this is; a stale copy changes nothing.
        Asking in person drops a payload it parked (it must not come twice).
        ``in_place``: refused, it waits in place (`Parking.mark_in_place`), so a release
        may grant it a permit of ``lease_ms`` directly (after_free.py)."""
        self.begin(caller.pause_ms, now_us)
        if handover is not None:
            arrived = self.parking.arrive(holder, handover, now_us // 1000)
            if arrived is Arrival.STALE:
                return Stale(self.parking.records[holder].token)
        gate = self.open_gate(caller, holder, ticket, handover, now_us)
        weigh_at = gate.ticket if gate.ticket is not None else self.place(ask, now_us).ticket
        gate.judged = self.judge(caller, ask, weigh_at, held=gate.holding is not None,
                                 now_us=now_us)  # fmt: skip
        if gate.judged.admitted:
            result: Granted | Refused = self.grant(
                caller, gate, ask=ask, info=info, lease_ms=lease_ms, now_us=now_us
            )
        else:
            place = gate.ticket
            if waiter_lease_ms > 0 and place is None:
                place = self.new_ticket(ask, now_us)
            result = self.refuse(
                caller, gate, place, ask=ask, info=info, waiter_lease_ms=waiter_lease_ms,
                in_place_ms=lease_ms if in_place else None, now_us=now_us,
            )  # fmt: skip
        self.handovers = self.finish_gate(caller, gate, now_us)
        return result

    def open_gate(
        self, caller: Caller, holder: str, ticket: int | None, handover: int | None, now_us: int
    ) -> Gate:
        """The start of an acquire (open_gate()): its task has reached a worker (no longer
        sent); run-out leases are reclaimed; the caller's limit, rate and shadow limits
        are recorded; a holder written back by id after a data loss (token 0) asks
        because it held nothing (it was waiting): that entry goes, and it asks like
        anyone else; asking in person drops a payload it parked."""
        now_ms = now_us // 1000
        self.sent.pop(holder, None)
        reclaimed = self.reclaim(now_ms)
        self.record(caller)
        holding = self.holders.get(holder)
        if holding is not None and holding.token == 0:
            del self.holders[holder]
            if self.epochs.hash is not None:
                self.epochs.hash.restored -= 1
            holding = None
        in_line = self.waiters.get(holder)
        parked = self.parking.state_of(holder) is State.PARKED
        if in_line is not None and handover is None and parked:
            self.parking.forget(holder)
        place = None if in_line is None else in_line.ticket
        if ticket is not None and (place is None or ticket < place):
            place = ticket
        return Gate(holder, handover, reclaimed, holding, in_line, place)

    def finish_gate(self, caller: Caller, gate: Gate, now_us: int) -> list[Handover]:
        """The end of an acquire (finish_gate()): what follows freed capacity, if it
        reclaimed anything or left a line; else, after a grant under a rate that binds,
        the waiters of the next slots (`dispatch_due`). The handovers."""
        rate, shadow, judged = caller.rate, caller.shadow, gate.judged
        if gate.reclaimed or gate.left:
            return self.after_free(
                caller.dispatch, now_us, limit=caller.limit, rate=rate, shadow=shadow
            )
        binds = judged is not None and judged.room.grants != gcra.UNBOUNDED and "r" not in shadow
        if gate.granted and binds:
            return self.dispatch_due(
                caller.dispatch, now_us, limit=caller.limit, rate=rate, shadow=shadow
            )
        return []

    def leave_gate(self, gate: Gate) -> None:
        """Takes the contender out of this line (leave_gate(): acquire_all, where this
        semaphore would admit it while another refuses)."""
        if gate.in_line is not None:
            self.parking.unmark_in_place(gate.holder)
            gate.left = self.leave_line(gate.holder)

    def refuse(
        self,
        caller: Caller,
        gate: Gate,
        place: int | None,
        *,
        ask: Asked,
        info: str,
        waiter_lease_ms: int,
        now_us: int,
        in_place_ms: int | None = None,
    ) -> Refused:
        """Not granted (refuse_gate()): queueing, it stands in line at ``place`` (a new
        ticket if it had none), marked waiting in place for a permit of ``in_place_ms``
        if given, else unmarked; the reply says where it stands and what it waits for
        (and until when admissions are paused after a data loss)."""
        now_ms = now_us // 1000
        judged = gate.judged
        assert judged is not None
        queued = 0
        if not judged.admitted:  # this semaphore refused it (not a set's other one)
            self.counters.bump("m_refused")
            self.counters.bump("m_throttled", judged.need_permits <= judged.free)
        if waiter_lease_ms > 0 and place is not None:
            self.stand_in_line(
                gate.holder, place, lease_ms=waiter_lease_ms, info=info, ask=ask, now_ms=now_ms
            )
            if in_place_ms is not None:
                self.parking.mark_in_place(gate.holder, in_place_ms)
            elif gate.in_line is not None:
                self.parking.unmark_in_place(gate.holder)
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
            resumes_ms=self.resumes_ms,
        )

    def grant(
        self, caller: Caller, gate: Gate, *, ask: Asked, info: str, lease_ms: int, now_us: int
    ) -> Granted:
        """Grants the permit (grant_gate()): a new fencing token every time, even to a
        live holder asking again (same permits, same first grant time, no rate spent);
        a waiter leaves the line; the rate's schedule moves on by the grants it asked
        for (a shadow rate's too: its lateness is what it counts)."""
        now_ms = now_us // 1000
        judged, holding, holder = gate.judged, gate.holding, gate.holder
        assert judged is not None
        token = seq_after(self.fence, now_us)
        self.fence = token
        waited = 0
        if gate.in_line is not None:
            self.count_fair_grant(self.ask_of(holder), now_ms)
            waited = now_ms - gate.in_line.since_ms
            self.leave_line(holder, "served" if gate.handover is None else None, now_ms)
        rate = self.effective_rate(caller.rate)
        if holding is None and rate is not None:
            self.tat = gcra.spend(rate, self.tat, ask.grants, now_us)
        permits = ask.permits if holding is None else holding.permits
        acquired = now_ms if holding is None else holding.acquired_ms
        self.holders[holder] = Holding(token, acquired, now_ms + lease_ms, permits, info)
        gate.granted = True
        self.counters.bump("m_granted")
        self.counters.observe("wait", waited)
        late_ms = 0
        if "l" in judged.would:
            self.shadow_limit_refusals += 1
            self.shadow_peak = max(self.shadow_peak, judged.count + permits)
        if "r" in judged.would and rate is not None:
            late_ms = math.ceil(judged.room.slot_in(rate.interval_us, judged.need_grants) / 1000)
            self.shadow_rate_refusals += 1
            self.shadow_wait_ms += late_ms
        return Granted(token, now_ms + lease_ms, waited, judged.would, late_ms)

    #: enqueue.lua: see `places.take_place`.
    take_place = places.take_place

    def release(
        self, caller: Caller, holder: str, now_us: int, token: int | None = None, *, unused: int = 0
    ) -> bool:
        """Give a permit back (release.lua); whether one was released. Idempotent: a
        second release, an unknown or reclaimed holder, or a stale ``token`` releases
        nothing (a holder written back by id after a data loss, token 0, is released by
        any). Without a token (by id: a worker that lost the child) it also drops the
        holder's place in line. ``unused``: the permit's task never started, so the
        rate's grants it spent are given back too. Then, if anything was freed and
        someone waits, what follows freed capacity (handovers)."""
        self.begin(caller.pause_ms, now_us)
        reclaimed = self.reclaim(now_us // 1000)
        return self.give_back(caller, holder, now_us, token, unused=unused, reclaimed=reclaimed)

    #: release.lua with ARG.keep_as: see `kept.keep`.
    keep = kept.keep

    def give_back(
        self,
        caller: Caller,
        holder: str,
        now_us: int,
        token: int | None,
        *,
        unused: int = 0,
        reclaimed: int = 0,
    ) -> bool:
        """The rest of `release` (after begin() and reclaim(), which found
        ``reclaimed``)."""
        now_ms = now_us // 1000
        waiting = len(self.waiters)
        holding = self.holders.get(holder)
        released = holding is not None and (token is None or holding.token in (token, 0))
        if holding is not None and released:
            del self.holders[holder]
            self.note_hold(now_ms - holding.acquired_ms)
            self.counters.observe("hold", now_ms - holding.acquired_ms)
            self.released += holding.permits
            rate = self.effective_rate(NOTHING)
            if unused > 0 and rate is not None and self.tat is not None:
                self.tat = gcra.give_back(rate, self.tat, unused)
        left = False
        if token is None:
            self.sent.pop(holder, None)
            left = waiting > 0 and self.leave_line(holder, "forget")
            self.counters.bump("m_abandoned", left)
        if (released or reclaimed or left) and waiting > 0:
            self.handovers = self.after_free(
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
        pause_ms: int = PAUSE_AFTER_LOSS_MS,
        permits: Mapping[str, int] | None = None,
    ) -> tuple[int, list[str]]:
        """Compare-and-extend (renew.lua): each (holder, token) still live with that
        token (None: any; a holder written back by id holds token 0, which any renews)
        gets a lease of ``lease_ms`` from now; the others are lost. A lease that already
        ran out is reclaimed first: a renew never resurrects.

        While admissions are paused after a data loss, a missing holder is written back
        instead (`restore_holder`); ``permits``: what each holds (1 unless said)."""
        now_ms = now_us // 1000
        self.begin(pause_ms, now_us)
        reclaimed = self.reclaim(now_ms)
        lost = []
        lost_permits = 0  # those it came with a token for (m_lost)
        for holder, token in holders:
            holding = self.holders.get(holder)
            if holding is not None and (token is None or holding.token in (token, 0)):
                holding.expires_ms = now_ms + lease_ms
            elif holding is None and self.resumes_ms > 0:
                held = 1 if permits is None else permits.get(holder, 1)
                self.restore_holder(holder, token or 0, held, now_ms + lease_ms, now_ms)
            else:
                lost.append(holder)
                lost_permits += token is not None
        self.counters.bump("m_renewed", len(holders) - len(lost) - len(self.restored))
        self.counters.bump("m_lost", lost_permits)
        if reclaimed:
            self.handovers = self.after_free(dispatch, now_us, limit=None, rate=NOTHING)
        return now_ms + lease_ms, lost

    def restore_holder(
        self, holder: str, token: int, permits: int, expires_ms: int, now_ms: int
    ) -> None:
        """A renewal writes back a permit the data loss took (renew.lua, while paused):
        its token (0 when renewed by id alone: it may have been a waiter, and its own
        next ask drops it), first granted now, no info; counted in the epoch's
        ``restored``.

        Why: the tasks that held permits still run; written back during the pause,
        they count against the limit when the line resumes, so it is not exceeded."""
        self.holders[holder] = Holding(token, now_ms, expires_ms, permits, "")
        self.restored.append(holder)
        if self.epochs.hash is not None:
            self.epochs.hash.restored += 1

    # Settings (configure.lua): each answers the previous value, reclaims, then hands
    # over what is due (so a raised limit or an ended drain hands over at once) ------

    def configured(self, now_us: int, caller: Caller | None) -> None:
        """After a runtime setting changed: kept permits are recalled (kept, they would
        start tasks past a lowered limit, a drain or a rate), then what follows freed
        capacity (a raised limit or an ended drain admits waiters at once)."""
        self.begin(PAUSE_AFTER_LOSS_MS if caller is None else caller.pause_ms, now_us)
        self.reclaim(now_us // 1000)
        self.published.append(Recall())
        rate = NOTHING if caller is None or caller.rate is None else caller.rate
        cfg = None if caller is None else caller.dispatch
        self.handovers = self.after_free(cfg, now_us, limit=None, rate=rate)

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
        self.begin(caller.pause_ms, now_us)
        if self.effective_rate(NOTHING if caller.rate is None else caller.rate) is None:
            return
        self.rate_pause_ms = max(now_ms + ms, self.rate_pause_ms or 0)
        self.configured(now_us, caller)

    # Parking and handover (park.lua, dispatch.lua; see parking.py) ------------------

    #: park.lua: see `places.park`.
    park = places.park

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
        self.begin(caller.pause_ms, now_us)
        if not self.meta_found():
            return 0
        dropped = 0
        for holder in drop:
            if self.parking.state_of(holder) in (State.PARKED, State.HANDED):
                self.leave_line(holder, "forget")
                dropped += 1
        self.counters.bump("m_abandoned", dropped)
        reclaimed = self.reclaim(now_us // 1000)
        follow = self.after_free if reclaimed or dropped else self.dispatch_due
        self.handovers = follow(caller.dispatch, now_us, limit=None, rate=NOTHING)
        return dropped

    def claim(self, caller: Caller, taken: str, handed: str, token: int, now_us: int) -> Claimed:
        """Who the message ``taken`` from a parking queue is, for the process that got
        the handover (``handed``, ``token``): a swap where it is another parked waiter
        (claim.lua; see `Parking.claim`). It frees nothing, so it reclaims nothing
        and hands over nobody."""
        self.begin(caller.pause_ms, now_us)
        claimed = self.parking.claim(taken, handed, token)
        if claimed is Claimed.PUBLISH and taken != handed:
            self.swap_tickets(taken, handed)
        return claimed

    def swap_tickets(self, taken: str, handed: str) -> None:
        """``taken`` got ``handed``'s turn (`claim`): where its ticket is the later, they
        swap tickets, so that it is served in that place when it arrives (both wait in
        one parking queue: one account, one priority)."""
        mine, theirs = self.waiters.get(taken), self.waiters.get(handed)
        if mine is None or theirs is None or mine.ticket <= theirs.ticket:
            return
        self.waiters[taken] = replace(mine, ticket=theirs.ticket)
        self.waiters[handed] = replace(theirs, ticket=mine.ticket)

    def after_free(
        self,
        cfg: Dispatch | None,
        now_us: int,
        *,
        limit: int | None,
        rate: Rate | Declared | None,
        shadow: str | None = None,
    ) -> list[Handover]:
        """What follows freed capacity (after_free()): a released permit, a reclaimed
        lease or waiter, a waiter that left, a raised limit, an ended drain. Free
        permits go to the waiters in place at the head of the line, the others are
        woken (both published: `published`, see after_free.py), then the parked waiters
        now due are handed over (`dispatch_due`; the handovers)."""
        self.published += grant_in_place(self, limit=limit, rate=rate, now_us=now_us)
        self.published += wake(self, limit=limit, rate=rate, shadow=shadow, now_us=now_us)
        return self.dispatch_due(cfg, now_us, limit=limit, rate=rate, shadow=shadow)

    def dispatch_due(
        self,
        cfg: Dispatch | None,
        now_us: int,
        *,
        limit: int | None,
        rate: Rate | Declared | None,
        shadow: str | None = None,
    ) -> list[Handover]:
        """The parked waiters now due, handed over (see `after_free.dispatch`)."""
        return dispatch(self, cfg, now_us, limit=limit, rate=rate, shadow=shadow)

    # Reading ----------------------------------------------------------------------

    def status(self, caller: Caller, now_us: int) -> Status:
        """What status.lua reads (see `reading.status`)."""
        return reading.status(self, caller, now_us)
