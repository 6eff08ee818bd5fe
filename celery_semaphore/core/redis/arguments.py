"""The scripts' arguments and replies: a request (`celery_semaphore.core.requests`) as
the ARGV of its script, and the script's reply as the values of
`celery_semaphore.core.results` (read through `celery_semaphore.core.redis.replies`).

Each script's arguments are named once, here: a `typing.NamedTuple` per script (and per
group of a variadic tail), in ARGV order. Python packs them by keyword (a missing or
unknown name is a TypeError, and a mypy error); `SIGNATURES` gives the Lua the same
names, as a table of indexes (`Signature.lua()`: ``ARGV[ARG.holder]``) that scripts.py
puts before each script's own part. Every script's last ARGV is the epoch, which the
store adds after these (``EPOCH_ARG`` in common_epoch.lua).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from celery_semaphore.core.errors import StaleHandover
from celery_semaphore.core.model.parking import Dispatch
from celery_semaphore.core.protocol import FAIR_TOP, SENT_HORIZON, STATUS_MOST, SemaphoreSpec
from celery_semaphore.core.readings import claimed_of
from celery_semaphore.core.requests import (
    Acquire,
    AcquireAll,
    Claim,
    Configure,
    Enqueue,
    Park,
    Release,
    Renew,
)
from celery_semaphore.core.results import (
    Claimed,
    Grant,
    Handover,
    Parked,
    Place,
    Places,
    SemaphoreStatus,
)

from .keys import keys_of
from .replies import (
    CLAIM_CODES,
    ClaimReply,
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

#: A number, or '' for none.
IntOrEmpty = int | str


class AcquireArgs(NamedTuple):
    holder: str  #: id of the contender
    declared: int  #: the caller's limit (effective_limit()); recorded in meta.limit
    lease_ms: int  #: lease of a granted permit
    waiter_ms: int  #: how long a refused contender keeps its place; 0: don't queue
    ticket: IntOrEmpty  #: a ticket presented again
    info: str  #: free text stored with the holder/waiter (shown by status)
    idle_ms: int  #: every key expires after this long without use
    channel: str  #: the wake channel
    handover: IntOrEmpty  #: the token of the handed-over copy this is
    dispatch: str  #: '' or `dispatch_text()`
    in_place: str  #: '1': a refused contender waits in place (grant_in_place())
    family: str  #: '' or the semaphore's family (meta.family, for metrics.py)
    rate: str  #: '' or the caller's rate, "<interval µs>|<burst>"
    shadow: str  #: the caller's shadow limits: '', 'l', 'r' or 'lr'
    weight: str  #: '' or "<permits>|<grants>", with a priority and fair key


class ParkArgs(NamedTuple):
    holder: str  #: id of the waiter (the task id)
    ticket: IntOrEmpty  #: its ticket (else it keeps the one it has, or takes a new one)
    payload: str  #: handed back to whoever publishes it when due
    park_ms: int  #: how long the place holds without being handed over
    info: str  #: free text stored with the waiter
    idle_ms: int  #: every key expires after this long without use
    dispatch: str  #: '' or `dispatch_text()`
    due_ms: int  #: hand it over after this long even if its turn has not come
    channel: str  #: the wake channel
    weight: str  #: "<permits>|<grants>", or '' to keep the one recorded


class ClaimArgs(NamedTuple):
    taken: str  #: the task id of the message taken from a parking queue
    handed: str  #: the waiter the handover was for
    token: int  #: that handover's token


class DispatchArgs(NamedTuple):
    idle_ms: int  #: every key expires after this long without use
    channel: str  #: the wake channel
    dispatch: str  #: `dispatch_text()`


class Dropped(NamedTuple):
    holder: str  #: a parked or handed-over waiter to drop from the line


class EnqueueArgs(NamedTuple):
    holder: str  #: id of the future contender (the task id)
    waiter_ms: int  #: how long the place holds while nobody asks
    info: str  #: free text stored with the waiter
    idle_ms: int  #: every key expires after this long without use
    declared: int  #: the caller's limit; recorded only where none is
    family: str  #: '' or the family recorded with the limit
    horizon_ms: int  #: how long the task counts as sent before it reaches a worker
    channel: str  #: the wake channel
    rate: str  #: '' or the caller's rate
    weight: str  #: '' or "<permits>|<grants>" it will ask for, with a priority and fair key
    shadow: str  #: the caller's shadow limits, recorded only where no limit is


class Far(NamedTuple):
    """Enqueue's optional group (all or none): park the waiter at once if its turn is far."""

    window_us: int  #: far: the rate's slot further than this (or drained, or a long line)
    head: str  #: the payload parked is head .. ticket .. tail
    tail: str  #: (see head)
    park_ms: int  #: as `ParkArgs`
    dispatch: str  #: as `ParkArgs`
    due_ms: int  #: as `ParkArgs`


class ReleaseArgs(NamedTuple):
    holder: str  #: id of the holder
    token: IntOrEmpty  #: its fencing token ('': whatever this holder holds, and its place)
    idle_ms: int  #: every key expires after this long without use
    channel: str  #: the wake channel
    dispatch: str  #: '' or `dispatch_text()`
    declared: int  #: the caller's limit: what follows the release stays under it
    unused: IntOrEmpty  #: n > 0: the permit is given back unused (n: its rate grants)
    shadow: str  #: the caller's shadow limits
    keep_as: str  #: '', or the holder id its process keeps the permit as (nobody waits)
    keep_info: str  #: the kept permit's info


class RenewArgs(NamedTuple):
    lease_ms: int  #: the new lease, counted from now
    idle_ms: int  #: every key expires after this long without use
    channel: str  #: the wake channel
    dispatch: str  #: '' or `dispatch_text()`


class Held(NamedTuple):
    holder: str  #: id of a holder
    token: IntOrEmpty  #: its fencing token ('': any token of this holder)
    permits: IntOrEmpty  #: the permits it holds ('': 1), written back after a data loss


class ConfigureArgs(NamedTuple):
    field: str  #: the setting: 'override', 'draining', 'rate_override', ...
    value: str  #: its new value, or '' to clear it
    idle_ms: int  #: every key expires after this long without use
    channel: str  #: the wake channel
    dispatch: str  #: '' or `dispatch_text()`
    rate: str  #: '' or the caller's rate


class StatusArgs(NamedTuple):
    most: int  #: at most this many holders and waiters are listed
    horizon_ms: int  #: entries of ``sent`` older than this are not counted
    declared: int  #: the caller's limit
    rate: str  #: '' or the caller's rate
    fair_top: int  #: at most this many fair keys are listed


class CountsArgs(NamedTuple):
    horizon_ms: int  #: entries of ``sent`` older than this are not counted


class MetaField(NamedTuple):
    name: str  #: a meta field to answer with as it is


class AcquireAllArgs(NamedTuple):
    holder: str  #: id of the contender, the same in every semaphore
    hold_ms: int  #: its place in the lines that would admit it, while another refuses
    info: str  #: as `AcquireArgs`
    ticket: IntOrEmpty  #: a ticket presented again
    handover: str  #: "<i>|<token>": the copy semaphore i handed over, or ''


class Gate(NamedTuple):
    """acquire_all's arguments for one semaphore, each as `AcquireArgs`."""

    declared: int
    lease_ms: int
    waiter_ms: int
    idle_ms: int
    channel: str
    dispatch: str
    family: str
    rate: str
    shadow: str
    weight: str


class NoArgs(NamedTuple):
    """A script that takes the epoch alone, or (the parked index's read) nothing."""


class RegisterArgs(NamedTuple):
    name: str  #: the semaphore's name


class ForgetArgs(NamedTuple):
    name: str  #: the semaphore's name
    score: float  #: its score as the caller read it, before it found no parked waiter
    least_ms: int  #: the least age of a score that may go


#: The names a group's table in `Signature.lua()` has besides its fields.
_GROUP_KEYS = ("first", "size")


@dataclass(frozen=True)
class Signature:
    """A script's ARGV before the epoch: ``fixed``'s fields in order, then ``optional``'s
    (all or none), then any number of ``each``, a group named ``each_name`` in the Lua.

    ``fixed``, ``optional`` and ``each`` are `NamedTuple` classes."""

    fixed: type[tuple[Any, ...]]
    optional: type[tuple[Any, ...]] | None = None
    each: type[tuple[Any, ...]] | None = None
    each_name: str = ""

    def __post_init__(self) -> None:
        names = self.names()
        group = _fields(self.each) if self.each else ()
        if self.each_name:
            names.append(self.each_name)
        if len(set(names)) != len(names):
            raise ValueError(f"{self.fixed.__name__}: a name is used twice: {names}")
        if set(group) & set(_GROUP_KEYS):
            raise ValueError(f"{self.fixed.__name__}: {group} takes a name of {_GROUP_KEYS}")
        if bool(self.each) != bool(self.each_name):
            raise ValueError(f"{self.fixed.__name__}: each and each_name go together")

    def names(self) -> list[str]:
        """The names of the fixed (and optional) arguments, in ARGV order."""
        return [*_fields(self.fixed), *(_fields(self.optional) if self.optional else ())]

    def lua(self) -> str:
        """``local ARG = {...}``: each name's ARGV index, and the variadic group's first
        index, size and each field's offset in it (``ARGV[i + ARG.held.token]``)."""
        items = [f"{name} = {index}" for index, name in enumerate(self.names(), 1)]
        if self.each is not None:
            fields = _fields(self.each)
            group = [f"first = {len(items) + 1}", f"size = {len(fields)}"]
            group += [f"{name} = {offset}" for offset, name in enumerate(fields)]
            items.append(f"{self.each_name} = {{{', '.join(group)}}}")
        return f"local ARG = {{{', '.join(items)}}}"


def _fields(declared: type[tuple[Any, ...]]) -> tuple[str, ...]:
    return declared._fields  # type: ignore[attr-defined,no-any-return]


#: Each script's arguments (as named in `scripts.SOURCES`).
SIGNATURES = {
    "acquire": Signature(AcquireArgs),
    "enqueue": Signature(EnqueueArgs, optional=Far),
    "park": Signature(ParkArgs),
    "claim": Signature(ClaimArgs),
    "dispatch": Signature(DispatchArgs, each=Dropped, each_name="drop"),
    "release": Signature(ReleaseArgs),
    "renew": Signature(RenewArgs, each=Held, each_name="held"),
    "status": Signature(StatusArgs),
    "counts": Signature(CountsArgs, each=MetaField, each_name="fields"),
    "configure": Signature(ConfigureArgs),
    "epoch": Signature(NoArgs),
    "acquire_all": Signature(AcquireAllArgs, each=Gate, each_name="gate"),
    "parked_index/register": Signature(RegisterArgs),
    "parked_index/read": Signature(NoArgs),
    "parked_index/forget": Signature(ForgetArgs),
}


def channel_of(spec: SemaphoreSpec) -> str:
    """The semaphore's wake channel (`celery_semaphore.core.redis.keys`)."""
    return keys_of(spec.namespace, spec.name).channel


def dispatch_text(dispatch: Dispatch | None) -> str:
    """'' (this client publishes no handovers) or "<max block ms>|<deadline ms>|<rate
    lead ms>" (dispatch() in common_after_free.lua)."""
    if dispatch is None:
        return ""
    return f"{dispatch.max_block_ms}|{dispatch.deadline_ms}|{dispatch.lead_ms}"


def optional(value: int | None) -> IntOrEmpty:
    return "" if value is None else value


def acquire_args(spec: SemaphoreSpec, asked: Acquire) -> list[Any]:
    return list(
        AcquireArgs(
            holder=asked.holder,
            declared=spec.limit,
            lease_ms=asked.lease_ms,
            waiter_ms=asked.wait_ms,
            ticket=optional(asked.ticket),
            info=asked.info,
            idle_ms=spec.idle_ms,
            channel=channel_of(spec),
            handover=optional(asked.handover),
            dispatch=dispatch_text(spec.dispatch),
            in_place="1" if asked.in_place else "",
            family=spec.family,
            rate=spec.rate_text,
            shadow=spec.shadow_codes,
            weight=asked.ask.text,
        )
    )


def park_args(spec: SemaphoreSpec, asked: Park) -> list[Any]:
    return list(
        ParkArgs(
            holder=asked.holder,
            ticket=optional(asked.ticket),
            payload=asked.payload,
            park_ms=asked.park_ms,
            info=asked.info,
            idle_ms=spec.idle_ms,
            dispatch=dispatch_text(spec.dispatch),
            due_ms=asked.due_ms,
            channel=channel_of(spec),
            weight="" if asked.ask is None else (asked.ask.text or "1|1"),
        )
    )


def claim_args(spec: SemaphoreSpec, asked: Claim) -> list[Any]:
    return list(ClaimArgs(taken=asked.taken, handed=asked.handed, token=asked.token))


def dispatch_args(spec: SemaphoreSpec, drop: Sequence[str]) -> list[Any]:
    """Declares no limit (see effective_limit() in common_meta.lua): the heartbeat calls
    it on semaphores it knows only by name."""
    args: list[Any] = list(
        DispatchArgs(
            idle_ms=spec.idle_ms, channel=channel_of(spec), dispatch=dispatch_text(spec.dispatch)
        )
    )
    for holder in drop:
        args += Dropped(holder=holder)
    return args


def enqueue_args(spec: SemaphoreSpec, asked: Enqueue) -> list[Any]:
    """With `Far` when the waiter parks if its turn is far."""
    args: list[Any] = list(
        EnqueueArgs(
            holder=asked.holder,
            waiter_ms=asked.wait_ms,
            info=asked.info,
            idle_ms=spec.idle_ms,
            declared=spec.limit,
            family=spec.family,
            horizon_ms=spec.sent_horizon_ms,
            channel=channel_of(spec),
            rate=spec.rate_text,
            weight=asked.ask.text,
            shadow=spec.shadow_codes,
        )
    )
    far = asked.far
    if far is not None:
        args += Far(
            window_us=far.window_us,
            head=far.head,
            tail=far.tail,
            park_ms=far.park_ms,
            dispatch=dispatch_text(spec.dispatch),
            due_ms=far.due_ms,
        )
    return args


def release_args(spec: SemaphoreSpec, asked: Release) -> list[Any]:
    return list(
        ReleaseArgs(
            holder=asked.holder,
            token=optional(asked.token),
            idle_ms=spec.idle_ms,
            channel=channel_of(spec),
            dispatch=dispatch_text(spec.dispatch),
            declared=spec.limit,
            unused=asked.unused or "",
            shadow=spec.shadow_codes,
            keep_as=asked.keep_as,
            keep_info=asked.keep_info,
        )
    )


def renew_args(spec: SemaphoreSpec, asked: Renew) -> list[Any]:
    """Declares no limit, like `dispatch_args()` and `configure_args()`."""
    args: list[Any] = list(
        RenewArgs(
            lease_ms=asked.lease_ms,
            idle_ms=spec.idle_ms,
            channel=channel_of(spec),
            dispatch=dispatch_text(spec.dispatch),
        )
    )
    for holder, token, permits in asked.held:
        args += Held(holder=holder, token=optional(token), permits=optional(permits))
    return args


def configure_args(spec: SemaphoreSpec, asked: Configure) -> list[Any]:
    return list(
        ConfigureArgs(
            field=asked.field,
            value=asked.value,
            idle_ms=spec.idle_ms,
            channel=channel_of(spec),
            dispatch=dispatch_text(spec.dispatch),
            rate=spec.rate_text,
        )
    )


def status_args(spec: SemaphoreSpec) -> list[Any]:
    return list(
        StatusArgs(
            most=STATUS_MOST,
            horizon_ms=spec.sent_horizon_ms,
            declared=spec.limit,
            rate=spec.rate_text,
            fair_top=FAIR_TOP,
        )
    )


def counts_args(fields: Sequence[str]) -> list[Any]:
    """counts.lua's arguments (before the epoch): the sent horizon of a semaphore
    opened with the default settings, as `open_semaphore()` does, and ``fields``."""
    args: list[Any] = list(CountsArgs(horizon_ms=int(1000 * SENT_HORIZON)))
    for field in fields:
        args += MetaField(name=field)
    return args


def joint_acquire_args(specs: Sequence[SemaphoreSpec], asked: AcquireAll) -> list[Any]:
    """acquire_all.lua's arguments: the contender's, then a `Gate` per semaphore."""
    came_by = "" if asked.came_by is None else f"{asked.came_by[0] + 1}|{asked.came_by[1]}"
    args: list[Any] = list(
        AcquireAllArgs(
            holder=asked.holder,
            hold_ms=asked.hold_ms,
            info=asked.info,
            ticket=optional(asked.ticket),
            handover=came_by,
        )
    )
    for spec, wait_ms, lease_ms, ask in zip(
        specs, asked.wait_ms, asked.lease_ms, asked.asks, strict=True
    ):
        args += Gate(
            declared=spec.limit,
            lease_ms=lease_ms,
            waiter_ms=wait_ms,
            idle_ms=spec.idle_ms,
            channel=channel_of(spec),
            dispatch=dispatch_text(spec.dispatch),
            family=spec.family,
            rate=spec.rate_text,
            shadow=spec.shadow_codes,
            weight=ask.text,
        )
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


def parse_claim(reply: Sequence[Any]) -> Claimed:
    code = read(ClaimReply, reply).code
    if code not in CLAIM_CODES:
        raise ValueError(f"claim.lua answered with unknown code {code!r}")
    return claimed_of(CLAIM_CODES[code])


def parse_enqueue(reply: Sequence[Any], *, far: bool) -> tuple[Place, bool, list[Handover]]:
    if not far:
        return enqueued_place(read(Enqueued, reply)), False, []
    place = read(EnqueuedOrParked, reply)
    return enqueued_place(place), place.parked, place.handovers


def parse_dispatch(reply: Sequence[Any]) -> list[Handover]:
    return read(DispatchReply, reply).handovers


def parse_release(reply: Sequence[Any]) -> tuple[int, list[Handover]]:
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
