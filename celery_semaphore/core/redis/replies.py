"""The one place where script replies become values: each reply declared once.

`read()` turns a script's reply into its declared shape (a NamedTuple whose fields
name the script's values in order); the functions below turn shapes into the public
values of `celery_semaphore.core.results`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from celery_semaphore.core import readings
from celery_semaphore.core.model import replies as model_replies
from celery_semaphore.core.model.order import asked_from_text
from celery_semaphore.core.model.rate import Rate
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.readings import semaphore_status
from celery_semaphore.core.results import (
    Grant,
    Handover,
    Place,
    SemaphoreCounts,
    SemaphoreStatus,
)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# Script replies ------------------------------------------------------------------
#
# Each reply, and each record of a flat list in one, is declared once below: a
# class whose fields name the script's values in order (see the script's header).
# `read()` converts every value by its field's type and refuses a reply whose
# length differs, so no code picks values out of a reply by position.

_READERS: dict[type, tuple[Callable[[Any], Any], ...]] = {}
T = TypeVar("T", bound=tuple[Any, ...])


def reply_shape(cls: type[T]) -> type[T]:
    """Registers ``cls``, a NamedTuple, as the shape of a reply."""
    _READERS[cls] = tuple(_reader(hint) for hint in typing.get_type_hints(cls).values())
    return cls


def _optional_int(value: Any) -> int | None:
    return int(value) if text(value) else None


def _reader(hint: Any) -> Callable[[Any], Any]:
    scalars: dict[Any, Callable[[Any], Any]] = {
        int: int, float: float, str: text, bool: lambda value: bool(int(value)),
        int | None: _optional_int,
    }  # fmt: skip
    if hint in scalars:
        return scalars[hint]
    (item,) = typing.get_args(hint) if typing.get_origin(hint) is list else (None,)
    if item is str:
        return lambda value: [text(x) for x in value]
    if item is Handover:
        return lambda value: [
            Handover(row.holder, row.token, row.payload, row.delay_ms / 1000)
            for row in read_all(HandoverRow, value)
        ]
    if item in _READERS:
        return lambda value: read_all(item, value)
    raise TypeError(f"no reader for a reply field of type {hint!r}")


def read(shape: type[T], reply: Sequence[Any]) -> T:
    """``reply`` as a ``shape``; ValueError if its length is not the shape's."""
    readers = _READERS[shape]
    if len(reply) != len(readers):
        raise ValueError(
            f"a {shape.__name__} reply has {len(readers)} values, got {len(reply)}: {reply!r}"
        )
    return tuple.__new__(shape, [convert(v) for convert, v in zip(readers, reply, strict=True)])


def read_all(shape: type[T], flat: Sequence[Any]) -> list[T]:
    """A flat list of records, ``{a1, b1, a2, b2, ...}``, as ``shape``s."""
    if not flat:
        return []
    size = len(_READERS[shape])
    return [read(shape, flat[i : i + size]) for i in range(0, len(flat), size)]


@reply_shape
class HandoverRow(NamedTuple):
    """A `Handover`, in every reply that hands over."""

    holder: str
    token: int
    payload: str
    delay_ms: int


@reply_shape
class Granted(NamedTuple):
    """acquire.lua, code 1."""

    fencing_token: int
    expires_ms: int
    now_ms: int
    waited_ms: int
    shadow: str  # the shadow limits that would have refused it: '', 'l', 'r' or 'lr'
    shadow_wait_ms: int
    handovers: list[Handover]


@reply_shape
class Refused(NamedTuple):
    """acquire.lua, code 0 (ticket 0: not queued)."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    earliest_expiry_ms: int  # 0: no holder
    now_ms: int
    hold_ms: int  # 0: none yet
    grant_gap_ms: int  # 0: none yet
    resumes_ms: int  # 0: not paused after a data loss
    slot_us: int | None  # None: no rate
    rate_pause_ms: int  # 0: the rate is not paused by RateLimited
    handovers: list[Handover]


@reply_shape
class StaleCopy(NamedTuple):
    """acquire.lua, code 2: a stale copy of a handed-over waiter."""

    token: int


@reply_shape
class Enqueued(NamedTuple):
    """enqueue.lua."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    slot_us: int | None  # None: no rate


@reply_shape
class EnqueuedOrParked(NamedTuple):
    """enqueue.lua, when it parks a waiter whose turn is far."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    slot_us: int | None
    parked: bool
    handovers: list[Handover]


@reply_shape
class ParkReply(NamedTuple):
    """park.lua."""

    ticket: int
    position: int
    handovers: list[Handover]


@reply_shape
class ClaimReply(NamedTuple):
    """claim.lua: its code (`CLAIM_CODES`)."""

    code: int


#: claim.lua's codes.
CLAIM_CODES = {
    1: model_replies.Claimed.PUBLISH,
    2: model_replies.Claimed.STALE,
    3: model_replies.Claimed.ABSENT,
    0: model_replies.Claimed.VOID,
}


@reply_shape
class DispatchReply(NamedTuple):
    """dispatch.lua."""

    dropped: int
    handovers: list[Handover]


@reply_shape
class ReleaseReply(NamedTuple):
    """release.lua."""

    released: int  #: 0, 1, or 2: kept (`celery_semaphore.core.model.replies.KEPT`)
    held_ms: int
    handovers: list[Handover]


@reply_shape
class RenewReply(NamedTuple):
    """renew.lua."""

    expires_ms: int
    lost: list[str]
    handovers: list[Handover]
    restored: int


@reply_shape
class ConfigureReply(NamedTuple):
    """configure.lua: the setting's previous value ('': unset)."""

    previous: str
    handovers: list[Handover]


@reply_shape
class HolderRow(NamedTuple):
    holder: str
    expires_ms: float
    record: str  # hinfo: "<fencing token>|<acquired ms>[/<permits>]|<info>"


@reply_shape
class WaiterRow(NamedTuple):
    holder: str
    ticket: float
    expires_ms: int
    record: str  # winfo: "<first ask ms>|<info>"
    state: str  # a key of WAITER_STATES
    order: str  # its weight text while fair keys wait, else '' (see status.lua)


@reply_shape
class FairKeyRow(NamedTuple):
    key: str
    waiting: int
    grants: int


@reply_shape
class SentRow(NamedTuple):
    holder: str
    sent_ms: float


@reply_shape
class StatusReply(NamedTuple):
    """status.lua."""

    now_ms: int
    recorded_limit: int | None
    override: int | None
    effective_limit: int
    draining: bool
    holder_count: int
    waiter_count: int
    holders: list[HolderRow]
    waiters: list[WaiterRow]
    parked_count: int
    handed_over_count: int
    sent_count: int
    sent_without_place: list[SentRow]
    sent_without_place_count: int
    resumes_ms: int
    rate: str  # "<interval µs>|<burst>", or '': none
    rate_override: str
    rate_room: int
    next_start_ms: int
    rate_paused_until_ms: int  # 0: no pause
    fair_keys_waiting: int
    fair_grants: int
    fair_keys_read: int
    fair_keys: list[FairKeyRow]
    shadow_limit_refusals: int
    shadow_rate_refusals: int
    shadow_wait_ms: int
    shadow_peak: int
    recorded_shadow: str  # meta.shadow: '', 'l', 'r' or 'lr'


@reply_shape
class CountsReply(NamedTuple):
    """counts.lua."""

    now_ms: int
    recorded_limit: int | None
    effective_limit: int
    draining: bool
    holder_count: int
    waiter_count: int
    parked_count: int
    handed_over_count: int
    sent_count: int
    rate: str  # "<interval µs>|<burst>", or '': none
    rate_paused_until_ms: int  # 0: no pause
    fair_keys_waiting: int
    kept_count: int  # permits held by kept holders (KEPT_PREFIX)
    values: list[str]  # of the fields asked, in order


def parse_counts(name: str, fields: Sequence[str], reply: Sequence[Any]) -> SemaphoreCounts:
    counts = read(CountsReply, reply)
    return SemaphoreCounts(
        name=name,
        declared_limit=counts.recorded_limit,
        effective_limit=counts.effective_limit,
        draining=counts.draining,
        holder_count=counts.holder_count,
        waiter_count=counts.waiter_count,
        server_time=counts.now_ms / 1000,
        parked_count=counts.parked_count,
        handed_over_count=counts.handed_over_count,
        sent_count=counts.sent_count,
        rate=RateLimit.decode(counts.rate),
        rate_paused_until=counts.rate_paused_until_ms / 1000
        if counts.rate_paused_until_ms
        else None,
        fair_keys_waiting=counts.fair_keys_waiting,
        kept_count=counts.kept_count,
        fields=dict(zip(fields, counts.values, strict=True)),
    )


def grant_of(granted: Granted) -> Grant:
    return readings.grant_of(
        model_replies.Granted(granted.fencing_token, granted.expires_ms, granted.waited_ms,
                              granted.shadow, granted.shadow_wait_ms)
    )  # fmt: skip


def enqueued_place(place: Enqueued | EnqueuedOrParked) -> Place:
    return readings.enqueued_place(
        model_replies.Enqueued(place.ticket, place.position, place.holders, place.limit,
                               place.draining, place.slot_us)
    )  # fmt: skip


def place_of(refused: Refused) -> Place:
    modelled = model_replies.Refused(
        refused.ticket, refused.position, refused.holders, refused.limit, refused.draining,
        refused.earliest_expiry_ms, refused.slot_us, refused.rate_pause_ms, refused.resumes_ms,
    )  # fmt: skip
    return readings.place_of(
        modelled, refused.now_ms, hold_ms=refused.hold_ms, grant_gap_ms=refused.grant_gap_ms
    )


def model_rate(text_: str) -> Rate | None:
    """A rate in the scripts' form ("<interval µs>|<burst>", '' for none)."""
    if not text_:
        return None
    interval, _, burst = text_.partition("|")
    return Rate(int(interval), int(burst or 1))


def holder_row(row: HolderRow) -> model_replies.HolderRow:
    """A holder as status.lua lists it: its hinfo record, "<fencing token>|<acquired
    ms>[/<permits>]|<info>", read into named fields (the one place it is read)."""
    token, acquired, info = [*row.record.split("|", 2), "", ""][:3]
    acquired, _, permits = acquired.partition("/")
    return model_replies.HolderRow(
        row.holder, int(token or 0), int(acquired or 0), int(row.expires_ms), info,
        int(permits or 1),
    )  # fmt: skip


def waiter_row(row: WaiterRow) -> model_replies.WaiterRow:
    """A waiter as status.lua lists it: its winfo record, "<first ask ms>|<info>", and
    its weight text while fair keys wait, read into named fields."""
    since, _, info = row.record.partition("|")
    ask = asked_from_text(row.order) if row.order else None
    return model_replies.WaiterRow(
        row.holder, int(row.ticket), int(since or 0), row.expires_ms, info, ask, row.state
    )


def status_of(name: str, reply: Sequence[Any]) -> SemaphoreStatus:
    """status.lua's reply as a `SemaphoreStatus` of semaphore ``name`` (read into the
    model's `Status`, which every store reads into: `celery_semaphore.core.readings`)."""
    status = read(StatusReply, reply)
    return semaphore_status(
        name,
        model_replies.Status(
            now_ms=status.now_ms,
            recorded_limit=status.recorded_limit,
            override=status.override,
            effective_limit=status.effective_limit,
            draining=status.draining,
            holder_count=status.holder_count,
            waiter_count=status.waiter_count,
            holders=[holder_row(row) for row in status.holders],
            waiters=[waiter_row(row) for row in status.waiters],
            parked_count=status.parked_count,
            handed_over_count=status.handed_over_count,
            sent_count=status.sent_count,
            sent_without_place=[
                model_replies.SentRow(row.holder, int(row.sent_ms))
                for row in status.sent_without_place
            ],
            sent_without_place_count=status.sent_without_place_count,
            rate=model_rate(status.rate),
            rate_override=model_rate(status.rate_override),
            rate_room=status.rate_room,
            next_start_ms=status.next_start_ms,
            rate_paused_until_ms=status.rate_paused_until_ms,
            fair_keys_waiting=status.fair_keys_waiting,
            fair_grants=status.fair_grants,
            fair_keys=[
                model_replies.FairKeyRow(row.key, row.waiting, row.grants)
                for row in status.fair_keys
            ],
            fair_keys_read=status.fair_keys_read,
            shadow_limit_refusals=status.shadow_limit_refusals,
            shadow_rate_refusals=status.shadow_rate_refusals,
            shadow_wait_ms=status.shadow_wait_ms,
            shadow_peak=status.shadow_peak,
            recorded_shadow=status.recorded_shadow,
            resumes_ms=status.resumes_ms,
        ),
    )
