"""What a store answers, as the values of `celery_semaphore.core.results`: a grant, a
place in line, a status. Every store reads its answers into the model's replies
(`celery_semaphore.core.model.replies`: the scripts' fields, named once; the Redis
store from its scripts' replies, the memory store from its model), and this is the one
place they become a `Grant`, a `Place`, a `Claimed` or a `SemaphoreStatus`.
"""

from __future__ import annotations

from celery_semaphore.core.model import replies
from celery_semaphore.core.model.rate import Rate
from celery_semaphore.core.model.replies import Enqueued, Granted, Refused, Status
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.results import (
    WAITER_STATES,
    Claimed,
    FairKeyInfo,
    Grant,
    HolderInfo,
    Place,
    SemaphoreCounts,
    SemaphoreStatus,
    WaiterInfo,
    shadow_kinds,
)


def rate_limit(rate: Rate | None) -> RateLimit | None:
    return None if rate is None else RateLimit.decode(f"{rate.interval_us}|{rate.burst}")


def grant_of(granted: Granted) -> Grant:
    return Grant(
        granted.token,
        granted.expires_ms / 1000,
        granted.waited_ms / 1000,
        shadow_kinds(granted.shadow),
        granted.shadow_wait_ms / 1000,
    )


def claimed_of(claimed: replies.Claimed) -> Claimed:
    return Claimed(claimed.value)


def seconds(microseconds: int | None) -> float | None:
    return None if microseconds is None else microseconds / 1_000_000


def place_of(refused: Refused, now_ms: int, *, hold_ms: int = 0, grant_gap_ms: int = 0) -> Place:
    """A refusal at ``now_ms`` as the `Place` it leaves; ``hold_ms``, ``grant_gap_ms``:
    the store's estimates of a hold and of the time between grants (0: none)."""
    earliest = refused.earliest_expiry_ms
    return Place(
        ticket=refused.ticket,
        position=refused.position,
        holders=refused.holders,
        limit=refused.limit,
        draining=refused.draining,
        next_expiry_in=max(0.0, (earliest - now_ms) / 1000) if earliest else None,
        hold_estimate=hold_ms / 1000 if hold_ms else None,
        grant_interval=grant_gap_ms / 1000 if grant_gap_ms else None,
        resumes_in=max(0.0, (refused.resumes_ms - now_ms) / 1000) if refused.resumes_ms else None,
        rate_due=seconds(refused.slot_us),
        rate_paused_for=max(0.0, (refused.rate_pause_ms - now_ms) / 1000)
        if refused.rate_pause_ms
        else None,
    )


def enqueued_place(place: Enqueued) -> Place:
    return Place(place.ticket, place.position, place.holders, place.limit, place.draining,
                 next_expiry_in=None, rate_due=seconds(place.slot_us))  # fmt: skip


def semaphore_status(name: str, status: Status) -> SemaphoreStatus:
    """``status`` of semaphore ``name`` as an operator sees it: times in seconds,
    holders by when they were granted, waiters in line order with their positions."""
    holders = sorted(
        (
            HolderInfo(
                h.holder, h.token, h.acquired_ms / 1000, h.expires_ms / 1000, h.info, h.permits
            )
            for h in status.holders
        ),
        key=lambda h: h.acquired_at,
    )
    waiters = [
        WaiterInfo(
            w.holder,
            w.ticket,
            position,
            w.since_ms / 1000,
            w.expires_ms / 1000,
            w.info,
            WAITER_STATES[w.state],
            None if w.ask is None else w.ask.fair_key,
        )
        for position, w in enumerate(status.waiters, 1)
    ]
    grants = status.fair_grants
    sent = status.sent_without_place
    return SemaphoreStatus(
        name=name,
        declared_limit=status.recorded_limit,
        override=status.override,
        effective_limit=status.effective_limit,
        draining=status.draining,
        holder_count=status.holder_count,
        waiter_count=status.waiter_count,
        holders=holders,
        waiters=waiters,
        server_time=status.now_ms / 1000,
        parked_count=status.parked_count,
        handed_over_count=status.handed_over_count,
        sent_count=status.sent_count,
        sent_without_place=[
            WaiterInfo(s.holder, 0, 0, s.sent_ms / 1000, 0.0, "", "in broker") for s in sent
        ],
        sent_without_place_count=len(sent)
        if status.sent_without_place_count is None
        else status.sent_without_place_count,
        resumes_at=status.resumes_ms / 1000 if status.resumes_ms else None,
        rate=rate_limit(status.rate),
        rate_override=rate_limit(status.rate_override),
        rate_room=status.rate_room,
        next_start_at=status.next_start_ms / 1000 if status.rate else None,
        rate_paused_until=status.rate_paused_until_ms / 1000
        if status.rate_paused_until_ms
        else None,
        fair_keys_waiting=status.fair_keys_waiting,
        fair_grants=grants,
        fair_keys=[
            FairKeyInfo(k.key, k.waiting, k.grants, round(k.grants / grants, 3) if grants else 0.0)
            for k in status.fair_keys
        ],
        fair_keys_read=status.fair_keys_waiting
        if status.fair_keys_read is None
        else status.fair_keys_read,
        shadow_limit_refusals=status.shadow_limit_refusals,
        shadow_rate_refusals=status.shadow_rate_refusals,
        shadow_delay=status.shadow_wait_ms / 1000,
        shadow_peak=status.shadow_peak,
        shadow=shadow_kinds(status.recorded_shadow),
    )


def counts_of(status: SemaphoreStatus, fields: dict[str, str]) -> SemaphoreCounts:
    """The counts a scrape reads, from a whole status (a store that reads no cheaper
    form: the memory store), with the ``meta`` ``fields`` given."""
    return SemaphoreCounts(
        name=status.name,
        declared_limit=status.declared_limit,
        effective_limit=status.effective_limit,
        draining=status.draining,
        holder_count=status.holder_count,
        waiter_count=status.waiter_count,
        server_time=status.server_time,
        parked_count=status.parked_count,
        handed_over_count=status.handed_over_count,
        sent_count=status.sent_count,
        rate=status.rate,
        rate_paused_until=status.rate_paused_until,
        fair_keys_waiting=status.fair_keys_waiting,
        kept_count=status.kept_count,
        fields=fields,
    )
