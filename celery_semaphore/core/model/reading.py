"""Reading a semaphore (status.lua): it changes nothing, so it reclaims nothing."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .order import recent
from .parking import State
from .replies import NOTHING, Caller, FairKeyRow, HolderRow, SentRow, Status, WaiterRow

if TYPE_CHECKING:
    from .semaphore import SemaphoreModel

#: status.lua lists at most this many fair keys (protocol.FAIR_TOP).
FAIR_TOP = 20


def waiter_state(model: SemaphoreModel, waiter: str) -> str:
    """A waiter's state as status shows it: "p" parked, "h" handed over, "w" waiting
    in place, else ""."""
    state = model.parking.state_of(waiter)
    return state.value if state in (State.PARKED, State.HANDED, State.IN_PLACE) else ""


def status(model: SemaphoreModel, caller: Caller, now_us: int) -> Status:
    """What status.lua reads (it changes nothing, so it reclaims nothing): entries
    whose lease ran out are left out of the lists and counts. A reader neither makes
    nor learns an epoch: it reads the pause after a data loss that is there."""
    now_ms = now_us // 1000
    _, resumes_ms = model.epochs.settle(0, now_us)
    declared = NOTHING if caller.rate is None else caller.rate
    rate = model.effective_rate(declared)
    room = model.room(declared, now_us)
    holders = sorted(
        (h for h in model.holders.items() if h[1].expires_ms > now_ms),
        key=lambda h: (h[1].expires_ms, h[0].encode()),
    )
    waiters = [w for w in model.line() if model.waiters[w].expires_ms > now_ms]
    horizon = now_ms - caller.sent_horizon_ms
    sent = sorted((ms, h.encode(), h) for h, ms in model.sent.items() if ms >= horizon)
    lapsed = [
        h for _, _, h in sent if h not in model.waiters or model.waiters[h].expires_ms <= now_ms
    ]
    fair_keys = sorted(
        (
            FairKeyRow(key, f.waiting, recent(f.grants, f.minute, f.grants_before, now_ms))
            for key, f in model.fair.items()
        ),
        key=lambda row: (-row.waiting, -row.grants, row.key),
    )
    pause = model.rate_pause_ms or 0
    return Status(
        now_ms=now_ms,
        recorded_limit=model.recorded_limit,
        override=model.override,
        effective_limit=model.effective_limit(caller.limit),
        draining=model.draining,
        holder_count=sum(h.permits for _, h in holders),
        waiter_count=len(waiters),
        holders=[
            HolderRow(h, x.token, x.acquired_ms, x.expires_ms, x.info, x.permits)
            for h, x in holders
        ],
        waiters=[
            WaiterRow(
                w,
                model.waiters[w].ticket,
                model.waiters[w].since_ms,
                model.waiters[w].expires_ms,
                model.waiters[w].info,
                model.asks.get(w) if model.fair else None,
                waiter_state(model, w),
            )
            for w in waiters
        ],
        parked_count=model.parking.count(State.PARKED),
        handed_over_count=model.parking.count(State.HANDED),
        sent_count=len(sent),
        sent_without_place=[SentRow(h, model.sent[h]) for h in lapsed],
        rate=rate,
        rate_override=model.rate_override,
        rate_room=0 if rate is None else int(room.grants),
        next_start_ms=0 if rate is None else now_ms + math.ceil(room.next_us / 1000),
        rate_paused_until_ms=pause if pause > now_ms else 0,
        fair_keys_waiting=len(model.fair),
        fair_grants=recent(*model.fair_grants, now_ms) if model.fair else 0,
        fair_keys=fair_keys[:FAIR_TOP],
        shadow_limit_refusals=model.shadow_limit_refusals,
        shadow_rate_refusals=model.shadow_rate_refusals,
        shadow_wait_ms=model.shadow_wait_ms,
        shadow_peak=model.shadow_peak,
        recorded_shadow=model.recorded_shadow,
        resumes_ms=resumes_ms,
    )
