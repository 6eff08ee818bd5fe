"""The scripts' arguments and replies: a request (`celery_semaphore.core.requests`) as
the ARGV of its script, and the script's reply as the values of
`celery_semaphore.core.results` (read through `celery_semaphore.core.redis.replies`).

Every script's last ARGV is the epoch, which the store adds (`common_epoch.lua`); the
order of each script's arguments is its Lua header's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_semaphore.core.errors import StaleHandover
from celery_semaphore.core.model.parking import Dispatch
from celery_semaphore.core.protocol import FAIR_TOP, SENT_HORIZON, STATUS_MOST, SemaphoreSpec
from celery_semaphore.core.requests import (
    Acquire,
    AcquireAll,
    Configure,
    Enqueue,
    Park,
    Release,
    Renew,
)
from celery_semaphore.core.results import Grant, Handover, Parked, Place, Places, SemaphoreStatus

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
    text,
)


def dispatch_text(dispatch: Dispatch | None) -> str:
    """'' (this client publishes no handovers) or "<max block ms>|<deadline ms>|<rate
    lead ms>" (dispatch() in common_after_free.lua)."""
    if dispatch is None:
        return ""
    return f"{dispatch.max_block_ms}|{dispatch.deadline_ms}|{dispatch.lead_ms}"


def optional(value: int | None) -> int | str:
    return "" if value is None else value


def acquire_args(spec: SemaphoreSpec, asked: Acquire) -> list[Any]:
    return [
        asked.holder,
        spec.limit,
        asked.lease_ms,
        asked.wait_ms,
        optional(asked.ticket),
        asked.info,
        spec.idle_ms,
        spec.keys.channel,
        optional(asked.handover),
        dispatch_text(spec.dispatch),
        "1" if asked.in_place else "",
        spec.family,
        spec.rate_text,
        spec.shadow_codes,
        asked.ask.text,
    ]


def park_args(spec: SemaphoreSpec, asked: Park) -> list[Any]:
    weight = "" if asked.ask is None else (asked.ask.text or "1|1")
    return [asked.holder, optional(asked.ticket), asked.payload, asked.park_ms, asked.info,
            spec.idle_ms, dispatch_text(spec.dispatch), asked.due_ms, spec.keys.channel,
            weight]  # fmt: skip


def dispatch_args(spec: SemaphoreSpec, drop: Sequence[str]) -> list[Any]:
    """Declares no limit (see effective_limit() in common_meta.lua): the heartbeat calls
    it on semaphores it knows only by name."""
    return [spec.idle_ms, spec.keys.channel, dispatch_text(spec.dispatch), *drop]


def enqueue_args(spec: SemaphoreSpec, asked: Enqueue) -> list[Any]:
    """ARGV[1..11]; and ARGV[12..17] when the waiter parks if its turn is far."""
    args: list[Any] = [asked.holder, asked.wait_ms, asked.info, spec.idle_ms, spec.limit,
                       spec.family, spec.sent_horizon_ms, spec.keys.channel, spec.rate_text,
                       asked.ask.text, spec.shadow_codes]  # fmt: skip
    far = asked.far
    if far is not None:
        args += [far.window_us, far.head, far.tail, far.park_ms, dispatch_text(spec.dispatch),
                 far.due_ms]  # fmt: skip
    return args


def release_args(spec: SemaphoreSpec, asked: Release) -> list[Any]:
    return [asked.holder, optional(asked.token), spec.idle_ms, spec.keys.channel,
            dispatch_text(spec.dispatch), spec.limit, asked.unused or "",
            spec.shadow_codes]  # fmt: skip


def renew_args(spec: SemaphoreSpec, asked: Renew) -> list[Any]:
    """Declares no limit, like `dispatch_args()` and `configure_args()`."""
    args: list[Any] = [
        asked.lease_ms,
        spec.idle_ms,
        spec.keys.channel,
        dispatch_text(spec.dispatch),
    ]
    for holder, token, permits in asked.held:
        args += [holder, optional(token), optional(permits)]
    return args


def configure_args(spec: SemaphoreSpec, asked: Configure) -> list[Any]:
    return [asked.field, asked.value, spec.idle_ms, spec.keys.channel,
            dispatch_text(spec.dispatch), spec.rate_text]  # fmt: skip


def status_args(spec: SemaphoreSpec) -> list[Any]:
    return [STATUS_MOST, spec.sent_horizon_ms, spec.limit, spec.rate_text, FAIR_TOP]


def counts_args(fields: Sequence[str]) -> list[Any]:
    """counts.lua's arguments (before the epoch): the sent horizon of a semaphore
    opened with the default settings, as `open_semaphore()` does, and ``fields``."""
    return [int(1000 * SENT_HORIZON), *fields]


def joint_acquire_args(specs: Sequence[SemaphoreSpec], asked: AcquireAll) -> list[Any]:
    """acquire_all.lua's arguments: the contender's, then ten per semaphore."""
    came_by = "" if asked.came_by is None else f"{asked.came_by[0] + 1}|{asked.came_by[1]}"
    args: list[Any] = [asked.holder, asked.hold_ms, asked.info, optional(asked.ticket), came_by]
    for spec, wait_ms, lease_ms, ask in zip(
        specs, asked.wait_ms, asked.lease_ms, asked.asks, strict=True
    ):
        args += [spec.limit, lease_ms, wait_ms, spec.idle_ms, spec.keys.channel,
                 dispatch_text(spec.dispatch), spec.family, spec.rate_text, spec.shadow_codes,
                 ask.text]  # fmt: skip
    return args


# Replies ---------------------------------------------------------------------------


def parse_acquire(name: str, reply: Sequence[Any]) -> tuple[Grant | Place, list[Handover]]:
    """The attempt's outcome and the parked waiters it made due (by reclaiming)."""
    code, *values = reply
    if code == 1:
        granted = read(Granted, values)
        return grant_of(granted), granted.handovers
    if code == 0:
        refused = read(Refused, values)
        return place_of(refused), refused.handovers
    if code == 2:
        raise StaleHandover(name, read(StaleCopy, values).token)
    raise ValueError(f"acquire.lua answered with unknown code {code!r}")


def parse_park(reply: Sequence[Any]) -> tuple[Parked, list[Handover]]:
    parked = read(ParkReply, reply)
    return Parked(parked.ticket, parked.position), parked.handovers


def parse_enqueue(reply: Sequence[Any], *, far: bool) -> tuple[Place, bool, list[Handover]]:
    if not far:
        return enqueued_place(read(Enqueued, reply)), False, []
    place = read(EnqueuedOrParked, reply)
    return enqueued_place(place), place.parked, place.handovers


def parse_dispatch(reply: Sequence[Any]) -> list[Handover]:
    return read(DispatchReply, reply).handovers


def parse_release(reply: Sequence[Any]) -> tuple[bool, list[Handover]]:
    released = read(ReleaseReply, reply)
    return released.released, released.handovers


def parse_renew(reply: Sequence[Any]) -> tuple[float, set[str], list[Handover], int]:
    renewed = read(RenewReply, reply)
    return renewed.expires_ms / 1000, set(renewed.lost), renewed.handovers, renewed.restored


def parse_configure(reply: Sequence[Any]) -> tuple[str | None, list[Handover]]:
    configured = read(ConfigureReply, reply)
    return configured.previous or None, configured.handovers


def parse_status(name: str, reply: Sequence[Any]) -> SemaphoreStatus:
    return status_of(name, reply)


def parse_joint_acquire(
    specs: Sequence[SemaphoreSpec], reply: Sequence[Any]
) -> tuple[list[Grant] | Places, list[list[Handover]]]:
    """The joint attempt's outcome (a grant per semaphore, or `Places`) and the parked
    waiters it made due in each semaphore."""
    code, *values = reply
    if code == 1:
        if len(values) != len(specs):
            raise ValueError(f"acquire_all.lua granted {len(values)} of {len(specs)}: {reply!r}")
        granted = [read(Granted, row) for row in values]
        return [grant_of(row) for row in granted], [row.handovers for row in granted]
    if code == 0:
        ticket, refused_by, *rows = values
        if len(rows) != len(specs):
            raise ValueError(f"acquire_all.lua answered {len(rows)} of {len(specs)}: {reply!r}")
        refused = [read(Refused, row) for row in rows]
        places = Places(
            int(ticket),
            tuple(place_of(row) for row in refused),
            tuple(i for i, flag in enumerate(text(refused_by)) if flag == "1"),
        )
        return places, [row.handovers for row in refused]
    if code == 2:
        by, token = values
        raise StaleHandover(specs[int(by) - 1].name, int(token or 0))
    raise ValueError(f"acquire_all.lua answered with unknown code {code!r}")
