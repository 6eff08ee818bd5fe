"""The functions' replies (jsonb arrays, laid out in ``sql/functions.sql``) read as the
model's replies (`celery_semaphore.core.model.replies`), which
`celery_semaphore.core.readings` turns into results, as for every store."""

from __future__ import annotations

from typing import Any

from celery_semaphore.core.model.order import asked_from_text
from celery_semaphore.core.model.rate import Rate
from celery_semaphore.core.model.replies import (
    Enqueued,
    FairKeyRow,
    Granted,
    HolderRow,
    Refused,
    SentRow,
    Status,
    WaiterRow,
)
from celery_semaphore.core.results import Handover


def acquired(reply: list[Any]) -> tuple[Granted | Refused, int, int]:
    """acquire(): the reply, the database's now (ms) and its average hold (ms, 0: none)."""
    if reply[0] == 1:
        _, token, expires_ms, now_ms, waited_ms, shadow, late_ms = reply
        return Granted(token, expires_ms, waited_ms, shadow, late_ms), now_ms, 0
    (_, ticket, position, holders, limit, draining, earliest, now_ms, hold_ms, slot_us,
     pause_ms) = reply  # fmt: skip
    refused = Refused(ticket, position, holders, limit, draining, earliest, slot_us, pause_ms)
    return refused, now_ms, hold_ms


def enqueued(reply: list[Any]) -> Enqueued:
    ticket, position, holders, limit, draining, slot_us, parked, _ = reply
    return Enqueued(ticket, position, holders, limit, draining, slot_us, parked)


def handovers(rows: list[Any]) -> list[Handover]:
    """The handovers an operation made: [[holder, token, payload, delay ms]...]."""
    return [
        Handover(holder, token, payload, delay_ms / 1000)
        for holder, token, payload, delay_ms in rows
    ]


def status(reply: list[Any]) -> Status:
    (now_ms, recorded, override, effective, draining, held, waiting, holders, waiters,
     parked, handed, sent_count, sent_without_place, shadow, rate, rate_override, room,
     next_start_ms, paused_until_ms, shadow_limit, shadow_rate, shadow_wait_ms, shadow_peak, keys,
     fair_grants, fair_keys) = reply  # fmt: skip
    return Status(
        now_ms=now_ms,
        recorded_limit=recorded,
        override=override,
        effective_limit=effective,
        draining=draining,
        holder_count=held,
        waiter_count=waiting,
        holders=[HolderRow(*row) for row in holders],
        waiters=[
            WaiterRow(
                holder,
                ticket,
                since,
                expires,
                info,
                None if ask is None else asked_from_text(ask),
                state,
            )
            for holder, ticket, since, expires, info, state, ask in waiters
        ],
        parked_count=parked,
        handed_over_count=handed,
        sent_count=sent_count,
        sent_without_place=[SentRow(holder, sent_ms) for holder, sent_ms in sent_without_place],
        rate=None if rate is None else Rate(*rate),
        rate_override=None if rate_override is None else Rate(*rate_override),
        rate_room=room,
        next_start_ms=next_start_ms,
        rate_paused_until_ms=paused_until_ms,
        fair_keys_waiting=keys,
        fair_grants=fair_grants,
        fair_keys=[FairKeyRow(*row) for row in fair_keys],
        shadow_limit_refusals=shadow_limit,
        shadow_rate_refusals=shadow_rate,
        shadow_wait_ms=shadow_wait_ms,
        shadow_peak=shadow_peak,
        recorded_shadow=shadow,
    )
