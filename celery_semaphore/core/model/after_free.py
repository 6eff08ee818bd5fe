"""What follows freed capacity (lua/common_after_free.lua, after_free()): the waiters in
place granted their permits (grant_in_place()), the others woken (wake()): both
published on the semaphore's wake channel; then the parked waiters now due handed
over (dispatch()). `SemaphoreModel.after_free` runs the three in that order.

A waiter blocked in ``wait_for_turn`` listens on the wake channel; its attempts mark
it ``w`` (`Parking.mark_in_place`) with the lease it asks for. Timeline::

    waiter W: attempt(in_place) -> refused, marked w; SUBSCRIBE; sleeps
    holder H: release -> grant_in_place(): W holds the permit now;
              PUBLISH "g|W|<token>|<expires>|<waited>"; then wake()
    waiter W: reads its grant: runs without another round trip
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import rate as gcra
from .entries import Holding
from .order import seq_after
from .parking import Dispatch, Handover, State, window
from .rate import NO_ROOM_LIMIT
from .replies import Declared, GrantedInPlace, Published, WakeUp

if TYPE_CHECKING:
    from .rate import Rate
    from .semaphore import SemaphoreModel

#: wake() tells at most this many waiters at once where no limit binds (BATCH).
BATCH = 1000


def grant_in_place(
    model: SemaphoreModel, *, limit: int | None, rate: Rate | Declared | None, now_us: int
) -> list[Published]:
    """Free permits go straight to the waiters in place at the head of the line, in
    order, up to the first that is not waiting in place or needs more permits or rate
    grants than are left; each is told on the channel (its token, lease end, wait).

    Why: the next owner starts without another round trip, and nobody can take its
    turn in between. Only the effective limit and the rate's room count, shadow limits
    too: a grant one of them would refuse is made in person, where it is counted.
    Nothing while paused (draining, or after a data loss)."""
    if model.paused():
        return []
    now_ms = now_us // 1000
    permits = model.effective_limit(limit) - model.permits_held()
    room = model.room(rate, now_us).grants
    spent = 0
    told: list[Published] = []
    for holder in model.line():
        ask = model.ask_of(holder)
        lease_ms = model.parking.in_place_lease(holder)
        if ask.permits > permits or ask.grants > room or lease_ms is None:
            break
        waiting = model.waiters[holder]
        model.fence = seq_after(model.fence, now_us)
        model.count_fair_grant(ask, now_ms)
        model.leave_line(holder, "served", now_ms)
        expires_ms = now_ms + lease_ms
        model.holders[holder] = Holding(model.fence, now_ms, expires_ms, ask.permits, waiting.info)
        permits, room, spent = permits - ask.permits, room - ask.grants, spent + ask.grants
        told.append(GrantedInPlace(holder, model.fence, expires_ms, now_ms - waiting.since_ms))
        model.counters.observe("wait", now_ms - waiting.since_ms)
    model.counters.bump("m_granted", len(told))
    in_force = model.effective_rate(rate)
    if told and in_force is not None:
        model.tat = gcra.spend(in_force, model.tat, spent, now_us)
    return told


def wake(
    model: SemaphoreModel,
    *,
    limit: int | None,
    rate: Rate | Declared | None,
    shadow: str | None,
    now_us: int,
) -> list[Published]:
    """Tells the blocked waiters that permits are free, with the highest ticket that
    may be admitted now (None: any), so those further back sleep on: the first ``free``
    waiters (free permits, the rate's room, one more than wait) that fit, weights
    counted. Nothing when paused, when nobody waits, or when nothing is free (the head
    needs more than is free). Only the limits that bind count (``shadow``; None: the
    recorded shadow limits)."""
    if model.paused() or not model.waiters:
        return []
    codes = model.recorded_shadow if shadow is None else shadow
    line = model.line()
    permits = math.inf if "l" in codes else model.effective_limit(limit) - model.permits_held()
    room = gcra.UNBOUNDED if "r" in codes else model.room(rate, now_us).grants
    free = min(permits, room, len(line) + 1)
    if permits == math.inf:
        free = min(free, BATCH)
    if free <= 0:
        return []
    first = line[: int(free)]
    n = k = j = 0
    for holder in first:
        ask = model.ask_of(holder)
        if k + ask.permits > permits or j + ask.grants > room:
            break
        n, k, j = n + 1, k + ask.permits, j + ask.grants
    if n == 0:
        return []
    if n == len(first) and len(first) < free:
        return [WakeUp(None)]
    return [WakeUp(model.waiters[first[n - 1]].ticket)]


def dispatch(
    model: SemaphoreModel,
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
    (again, with a new token, the previous one kept as the mark: that copy may only be
    late), and parked ones whose due time came; a due entry of one no longer in line
    (or an aged tombstone) is forgotten. Only the limits that bind count: a shadow
    limit (``shadow``; None: the recorded ones) moves nobody."""
    if cfg is None or not model.parking.records:
        return []
    now_ms = now_us // 1000
    codes = model.recorded_shadow if shadow is None else shadow
    binding = math.inf if "l" in codes else model.effective_limit(limit)
    room = NO_ROOM_LIMIT if "r" in codes else model.room(rate, now_us)
    in_force = None if room.grants == gcra.UNBOUNDED else model.effective_rate(rate)
    due = window(binding, model.permits_held(), paused=model.paused(), hold_ms=model.hold_ms or 0,
                 room=room, rate=in_force, cfg=cfg)  # fmt: skip
    paused = in_force is not None and (model.rate_pause_ms or 0) > now_ms
    out = []
    k = j = 0
    for holder in model.line()[: int(due.count)]:
        k, j = k + model.ask_of(holder).permits, j + model.ask_of(holder).grants
        record = model.parking.records.get(holder)
        parked = record is not None and record.state is State.PARKED
        progress = parked and record is not None and record.mark < model.released
        slot_ms = 0
        if in_force is not None:
            slot_ms = math.ceil(room.slot_in(in_force.interval_us, j) / 1000)
        if slot_ms > due.rate_window_ms or paused:
            if parked and (k <= due.permits or progress) and slot_ms <= cfg.deadline_ms:
                out.append(hand_over(model, holder, cfg, slot_ms, now_us))
            break
        if parked and ((k <= due.permits and j <= room.grants) or progress):
            out.append(hand_over(model, holder, cfg, 0, now_us))
    for holder in model.parking.late(now_ms):
        record = model.parking.records.get(holder)
        state = None if record is None else record.state
        if state in (State.HANDED, State.PARKED) and holder in model.waiters:
            previous = record.token if record is not None and state is State.HANDED else 0
            model.counters.bump("m_handover_retried", state is State.HANDED)
            out.append(hand_over(model, holder, cfg, 0, now_us, mark=previous))
        else:
            model.parking.forget(holder)
    model.counters.bump("m_handed_over", len(out))
    return out


def hand_over(
    model: SemaphoreModel, holder: str, cfg: Dispatch, delay_ms: int, now_us: int, *, mark: int = 0
) -> Handover:
    payload = model.parking.records[holder].payload
    return model.parking.hand_over(
        holder, payload, cfg=cfg, delay_ms=delay_ms, now_us=now_us, mark=mark
    )
