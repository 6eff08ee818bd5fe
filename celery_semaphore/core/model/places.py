"""Places in line taken without asking for a permit: take_place (enqueue.lua: a place
taken at publish, maybe parked at once when its turn is far) and park (park.lua: a
waiter leaves its payload to be handed over when due). Methods of `SemaphoreModel`."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from . import rate as gcra
from .entries import Waiting
from .order import PLAIN_ASKED, Asked
from .parking import ParkIfFar
from .replies import NOTHING, Caller, Enqueued, ParkedPlace, Recall

if TYPE_CHECKING:
    from .semaphore import SemaphoreModel


def take_place(
    model: SemaphoreModel,
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
    model.begin(caller.pause_ms, now_us)
    reclaimed = model.reclaim(now_ms)
    if model.recorded_limit is None:
        model.recorded_limit = caller.limit
        if caller.shadow:
            model.recorded_shadow = caller.shadow
    if reclaimed:  # it hands over nobody: a publisher calls it inside its publish
        model.after_free(None, now_us, limit=caller.limit, rate=caller.rate,
                        shadow=caller.shadow)  # fmt: skip
    waiting = model.waiters.get(holder)
    new = waiting is None
    if waiting is None:
        if not model.waiters:
            model.published.append(Recall())
        waiting = Waiting(model.new_ticket(ask, now_us), 0, now_ms, info)
        model.waiters[holder] = waiting
    ahead = model.ahead_of(waiting.ticket)
    model.weigh_waiter(holder, ask)
    rate = model.effective_rate(caller.rate)
    room = model.room(caller.rate, now_us)
    slot = None
    if rate is not None:
        grants = sum(model.ask_of(w).grants for w in ahead) + ask.grants
        slot = room.slot_in(rate.interval_us, grants)
    held = model.permits_held()
    reply = Enqueued(
        waiting.ticket, len(ahead) + 1, held, model.effective_limit(caller.limit),
        model.draining, slot,
    )  # fmt: skip
    if park_if_far is not None:
        binding = math.inf if "l" in caller.shadow else model.effective_limit(caller.limit)
        binds = room.grants != gcra.UNBOUNDED and "r" not in caller.shadow
        far = (
            model.draining
            or (binds and slot is not None and slot > park_if_far.window_us)
            or len(ahead) >= max(0, binding - held) + binding
        )
        if far:
            waiting.expires_ms = now_ms + park_if_far.park_lease_ms
            model.sent.pop(holder, None)
            model.parking.leave_payload(
                holder, park_if_far.head + str(waiting.ticket) + park_if_far.tail,
                released=model.released, due_ms=park_if_far.due_ms, now_ms=now_ms,
            )  # fmt: skip
            model.counters.bump("m_parked")
            model.handovers = model.dispatch_due(
                park_if_far.dispatch, now_us, limit=None, rate=caller.rate,
                shadow=caller.shadow,
            )  # fmt: skip
            return replace(reply, parked=True)
    if new:
        forget_sent_before(model, now_ms - caller.sent_horizon_ms)
        model.sent.setdefault(holder, now_ms)
    waiting.expires_ms = now_ms + waiter_lease_ms
    return reply


def park(
    model: SemaphoreModel,
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
    model.begin(caller.pause_ms, now_us)
    reclaimed = model.reclaim(now_ms)
    in_line = model.waiters.get(holder)
    place = None if in_line is None else in_line.ticket
    if ticket is not None and (place is None or ticket < place):
        place = ticket
    if place is None:
        place = model.new_ticket(ask or PLAIN_ASKED, now_us)
    model.stand_in_line(holder, place, lease_ms=park_lease_ms, info=info, ask=ask, now_ms=now_ms)
    model.sent.pop(holder, None)
    model.parking.leave_payload(
        holder, payload, released=model.released, due_ms=due_ms, now_ms=now_ms
    )
    model.counters.bump("m_parked")
    position = len(model.ahead_of(place)) + 1
    follow = model.after_free if reclaimed else model.dispatch_due
    model.handovers = follow(caller.dispatch, now_us, limit=None, rate=NOTHING)
    return ParkedPlace(place, position)


def forget_sent_before(model: SemaphoreModel, since_ms: int) -> None:
    """Tasks sent at ``since_ms`` or before (past the sent horizon) are no longer counted as
    sent, and forgotten (enqueue.lua's ZREMRANGEBYSCORE on ``sent`` as a new place is
    taken). Why: a task that never reached a worker (a purged queue, a lost message)
    would otherwise be kept for ever; status already leaves it out."""
    for holder in [h for h, sent_ms in model.sent.items() if sent_ms <= since_ms]:
        del model.sent[holder]
