"""What `Semaphore` and `AsyncSemaphore` share: settings, script
arguments, and the one place where script replies become results or errors.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from redis.crc import key_slot

from . import validation
from .ask import PLAIN, Ask
from .errors import StaleHandover
from .keys import ROLE_TYPES, SemaphoreKeys, semaphore_keys
from .rates import RateLimit, parse_rate

DEFAULT_NAMESPACE = "celery_semaphore"
DEFAULT_LEASE_TIMEOUT = 60.0
DEFAULT_WAITER_LEASE = 20.0
DEFAULT_RECHECK_INTERVAL = 2.0
DEFAULT_IDLE_TTL = 7 * 24 * 3600.0
DEFAULT_HANDOVER_WINDOW = 1.0
DEFAULT_HANDOVER_DEADLINE = 30.0
STATUS_MOST = 1000
#: The fair keys a status lists: those with the most waiters (see `SemaphoreStatus`).
FAIR_TOP = 20
#: How long a task published with a place is counted as sent (in the broker)
#: while it has not reached a worker; then it is presumed lost (a purged queue,
#: an expired message, a failed publish) and no longer counted.
SENT_HORIZON = 3600.0
#: Under a rate, parked waiters are handed over this long before their slots (or
#: three intervals, if longer; at most the handover window): long enough for a
#: published task to reach a worker, short enough that the workers hold few.
RATE_LEAD = 0.2
#: How long admissions stay paused after a data loss beyond the renewal interval:
#: time for a worker that notices the loss at its next beat to write its permits back.
PAUSE_MARGIN = 0.5


@dataclass(frozen=True)
class Place:
    """A refused attempt: the contender's place in line.

    ``ticket`` can be stored and presented again (``attempt(ticket=...)``) to
    regain this place after a pause longer than the waiter lease; 0 means the
    attempt did not queue. ``next_expiry_in`` is the time until the earliest
    holder lease runs out (None if nobody holds a permit); ``hold_estimate`` a
    moving average of how long permits of this semaphore were held (None before
    the first release); ``grant_interval`` a moving average of the time between
    two grants while others waited (None before there was a line): the pace at
    which the line moves, measured on the server. ``resumes_in``: while no
    permit is granted after Redis lost its data, the time until admissions
    resume (None otherwise). ``rate_due``: under a rate, the time until the rate
    allows this place a grant (its slot, counting the places ahead of it; None
    without a rate); ``rate_paused_for``: while a task's `RateLimited` pauses the
    rate, the time until the pause ends (None otherwise). ``limit_binds``: see there.
    """

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    next_expiry_in: float | None
    hold_estimate: float | None = None
    grant_interval: float | None = None
    resumes_in: float | None = None
    rate_due: float | None = None
    rate_paused_for: float | None = None
    #: False where ``limit`` is a shadow limit: it refuses nobody, so nobody's turn
    #: depends on it (``rate_due`` and ``rate_paused_for`` are None for a shadow rate).
    limit_binds: bool = True


@dataclass(frozen=True)
class Places:
    """A refused attempt on a set of semaphores (`AsyncSemaphoreSet`): nothing was
    granted on any of them.

    ``ticket``: the contender's one ticket, the same in every line it stands in (0:
    not queued); present it again to keep its places. ``places``: its `Place` in each
    semaphore, in the set's order (ticket 0 where it does not stand in line);
    ``refused_by``: the indexes of the semaphores that refused it (the others would
    have admitted it).
    """

    ticket: int
    places: tuple[Place, ...]
    refused_by: tuple[int, ...]


@dataclass(frozen=True)
class HolderInfo:
    """A live holder. Times are the Redis server's, in seconds since the epoch;
    ``info`` is what the holder said of itself when it asked (a `LimitedTask`:
    JSON with its task name, worker and pid)."""

    holder: str
    fencing_token: int
    acquired_at: float
    expires_at: float
    info: str
    #: The permits it holds (its weight; 1 unless it asked for more).
    permits: int = 1


@dataclass(frozen=True)
class WaiterInfo:
    """A waiter in line. ``state``: ``"parked"`` (it left a payload and stopped
    asking), ``"handed over"`` (its payload was handed over to be published and
    has not arrived yet), ``"waiting in place"`` (blocked in `wait_for_turn()`:
    a release grants it the permit directly), or ``"asking"`` (it asks itself,
    or comes back after a countdown)."""

    holder: str
    ticket: int
    position: int
    since: float
    expires_at: float
    info: str
    state: str = "asking"
    #: The key whose turns it takes (``fair_key=``), or None.
    fair_key: str | None = None


@dataclass(frozen=True)
class FairKeyInfo:
    """A fair key with waiters in line (``fair_key=``): how many, and its grants in
    this minute and the minute before of the Redis server's clock (60 to 120 s).
    ``share``: those grants over all fair keys' in the same minutes (0.0 when none);
    a key's count restarts when its last waiter leaves the line (its record goes)."""

    key: str
    waiting: int
    grants: int
    share: float


@dataclass(frozen=True)
class Handover:
    """A parked waiter now due: publish ``payload`` so that it arrives presenting
    ``token`` (``attempt(holder, handover=token)``), ``delay`` seconds from now
    (under a rate: when its slot comes)."""

    holder: str
    token: int
    payload: str
    delay: float = 0.0


@dataclass(frozen=True)
class Parked:
    """Where a parked waiter stands: its ``ticket`` and ``position`` in line."""

    ticket: int
    position: int


@dataclass(frozen=True)
class SemaphoreStatus:
    """One consistent reading of a semaphore (server time; lists capped at 1,000)."""

    name: str
    declared_limit: int | None
    override: int | None
    effective_limit: int
    draining: bool
    #: Permits in use: a holder of weight k counts k (``holders`` lists it once).
    holder_count: int
    waiter_count: int
    holders: list[HolderInfo]
    waiters: list[WaiterInfo]
    server_time: float
    parked_count: int = 0
    handed_over_count: int = 0
    #: Tasks published with a place in line that have not reached a worker yet:
    #: their messages wait in the broker. A place taken at publish lapses after a
    #: few seconds (so a lost message cannot block the line); these stay counted.
    sent_count: int = 0
    #: Those of them whose place lapsed (outside the line): state ``"in broker"``,
    #: ticket and position 0, oldest first (at most 1,000 listed).
    sent_without_place: list[WaiterInfo] = field(default_factory=list)
    #: How many of them there are (counted among the oldest 10,000 sent).
    sent_without_place_count: int = 0
    #: While no permit is granted after Redis lost its data: when admissions resume
    #: (server time); None otherwise.
    resumes_at: float | None = None
    #: The rate that applies (the override, else the one recorded by the last task
    #: that asked, or this client's), and the override; None: none.
    rate: RateLimit | None = None
    rate_override: RateLimit | None = None
    #: Under a rate: how many grants it allows now, and when the next one after
    #: those is allowed (server time).
    rate_room: int = 0
    next_start_at: float | None = None
    #: Until when the rate grants nothing after a task raised `RateLimited`; None: no pause.
    rate_paused_until: float | None = None
    #: Fair keys with waiters in line (``fair_key=``; 0: none, and nothing below is read).
    fair_keys_waiting: int = 0
    #: Grants to waiters of any fair key in this minute and the minute before (server clock).
    fair_grants: int = 0
    #: The 20 keys with the most waiting, most first (ties: more grants first). Read from
    #: a bounded sample when there are many: a scan of the meta hash that examines about
    #: 4,000 fields (``fair_keys_read`` < ``fair_keys_waiting``: the sample missed some).
    fair_keys: list[FairKeyInfo] = field(default_factory=list)
    fair_keys_read: int = 0
    #: What its shadow limits (``shadow=``) counted: grants the concurrency limit would
    #: have refused, grants the rate would have delayed and by how long in all (seconds),
    #: and the most permits held at once over the limit (the peak it would have had to
    #: allow; 0: never over). Counted since the semaphore's keys were made.
    shadow_limit_refusals: int = 0
    shadow_rate_refusals: int = 0
    shadow_delay: float = 0.0
    shadow_peak: int = 0
    #: The limits its tasks declare as shadow limits ("limit", "rate"), as the last
    #: task to ask recorded them: what the counts above count from now on (empty:
    #: every limit is enforced now, and the counts are from before).
    shadow: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SemaphoreCounts:
    """What a metrics scrape reads of one semaphore (counts.lua): the figures of
    `SemaphoreStatus` without its lists, each as `status()` reports it to a caller
    that declares no limit and no rate (the CLI's, the metrics'), in O(log n) Redis
    work, and the ``meta`` fields asked for (absent ones: '')."""

    name: str
    declared_limit: int | None
    effective_limit: int
    draining: bool
    holder_count: int
    waiter_count: int
    server_time: float
    parked_count: int
    handed_over_count: int
    sent_count: int
    rate: RateLimit | None
    rate_paused_until: float | None
    fair_keys_waiting: int
    fields: dict[str, str]


@dataclass(frozen=True)
class Grant:
    """The fields of a granted reply, before a permit object wraps them."""

    fencing_token: int
    expires_at: float
    waited: float
    #: The shadow limits that would have refused it ("limit", "rate"), and by how much
    #: the shadow rate's slot was ahead (seconds).
    shadow_refused: frozenset[str] = frozenset()
    shadow_wait: float = 0.0


SHADOW_CODES = {"l": "limit", "r": "rate"}


def shadow_kinds(codes: str) -> frozenset[str]:
    """The scripts' shadow codes ('', 'l', 'r', 'lr') as kinds; a code this version does
    not know (a later one's) is left out."""
    return frozenset(SHADOW_CODES[code] for code in codes if code in SHADOW_CODES)


WAITER_STATES = {"p": "parked", "h": "handed over", "w": "waiting in place", "": "asking"}
GRANT_PREFIX = "g|"  # a wake-up message that grants a waiter in place its permit


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
class DispatchReply(NamedTuple):
    """dispatch.lua."""

    dropped: int
    handovers: list[Handover]


@reply_shape
class ReleaseReply(NamedTuple):
    """release.lua."""

    released: bool
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
    values: list[str]  # of the fields asked, in order


def counts_args(fields: Sequence[str]) -> list[Any]:
    """counts.lua's arguments (before the epoch): the sent horizon of a semaphore
    opened with the default settings, as `open_semaphore()` does, and ``fields``."""
    return [int(1000 * SENT_HORIZON), *fields]


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
        fields=dict(zip(fields, counts.values, strict=True)),
    )


def fair_key_in(order: str) -> str | None:
    """The fair key of a weight text (`SemaphoreSpec.weight_arg`), or None."""
    parts = order.split("|", 4)
    return parts[4] if len(parts) == 5 else None


def rate_window(rate: RateLimit, handover_window: float) -> float:
    """How far ahead of their slots waiters under ``rate`` are handed over (dispatch()
    in common.lua computes the same from the rate in force)."""
    return min(handover_window, max(RATE_LEAD, 3 * rate.interval_us / 1_000_000))


def _seconds(microseconds: int | None) -> float | None:
    return None if microseconds is None else microseconds / 1_000_000


def new_holder_id() -> str:
    return uuid.uuid4().hex


def _grant(granted: Granted) -> Grant:
    return Grant(
        granted.fencing_token,
        granted.expires_ms / 1000,
        granted.waited_ms / 1000,
        shadow_kinds(granted.shadow),
        granted.shadow_wait_ms / 1000,
    )


def _enqueued_place(place: Enqueued | EnqueuedOrParked) -> Place:
    return Place(place.ticket, place.position, place.holders, place.limit, place.draining,
                 next_expiry_in=None, rate_due=_seconds(place.slot_us))  # fmt: skip


def _place(refused: Refused) -> Place:
    earliest, now = refused.earliest_expiry_ms, refused.now_ms
    return Place(
        ticket=refused.ticket,
        position=refused.position,
        holders=refused.holders,
        limit=refused.limit,
        draining=refused.draining,
        next_expiry_in=max(0.0, (earliest - now) / 1000) if earliest else None,
        hold_estimate=refused.hold_ms / 1000 if refused.hold_ms else None,
        grant_interval=refused.grant_gap_ms / 1000 if refused.grant_gap_ms else None,
        resumes_in=max(0.0, (refused.resumes_ms - now) / 1000) if refused.resumes_ms else None,
        rate_due=_seconds(refused.slot_us),
        rate_paused_for=max(0.0, (refused.rate_pause_ms - now) / 1000)
        if refused.rate_pause_ms
        else None,
    )


class SemaphoreSpec:
    """Validated settings of one semaphore and the wire format of its scripts."""

    def __init__(
        self,
        name: str,
        limit: int | None,
        *,
        lease_timeout: float,
        namespace: str,
        waiter_lease: float,
        recheck_interval: float,
        idle_ttl: float,
        handover_window: float | None = None,
        handover_deadline: float = DEFAULT_HANDOVER_DEADLINE,
        family: str = "",
        pause_after_loss: float | None = None,
        cluster: bool = False,
        rate: str | RateLimit | None = None,
        shadow: Iterable[str] = (),
        fair_weights: validation.FairWeights | None = None,
    ) -> None:
        self.name = validation.check_name(name)
        self.fair_weights = validation.check_fair_weights(fair_weights)
        self.family = validation.check_name(family, "family") if family != "" else ""
        if limit is None and rate is None:
            raise TypeError(
                f"limit (how many at once) or rate (how fast, like '20/s') must be given "
                f"for semaphore {name!r}, or both"
            )
        self.rate = None if rate is None else parse_rate(rate)
        self.rate_arg = "" if self.rate is None else self.rate.encode()
        self.shadow = frozenset(validation.check_shadow(shadow))
        self.shadow_arg = "".join(
            code for code, kind in SHADOW_CODES.items() if kind in self.shadow
        )
        #: Without a concurrency limit (a rate alone) the limit is the largest there is.
        self.limit = validation.MAX_LIMIT if limit is None else validation.check_limit(limit)
        self.lease_timeout = validation.check_seconds(lease_timeout, "lease_timeout")
        self.namespace = validation.check_namespace(namespace)
        self.waiter_lease = validation.check_seconds(waiter_lease, "waiter_lease")
        self.recheck_interval = validation.check_seconds(recheck_interval, "recheck_interval")
        idle = validation.check_seconds(idle_ttl, "idle_ttl")
        self.keys: SemaphoreKeys = semaphore_keys(self.namespace, self.name, cluster=cluster)
        self.pause_after_loss = (
            self.lease_timeout / 4 + PAUSE_MARGIN
            if pause_after_loss is None
            else validation.check_seconds(pause_after_loss, "pause_after_loss")
        )
        self.idle_ms = int(1000 * max(idle, 2 * self.lease_timeout, 2 * self.waiter_lease))
        self.sent_horizon_ms = min(self.idle_ms, int(1000 * SENT_HORIZON))
        # What the scripts need to hand parked waiters over ('': this client publishes none).
        self.dispatch = ""
        if handover_window is not None:
            window = validation.check_seconds(handover_window, "handover_window", allow_zero=True)
            deadline = validation.check_seconds(handover_deadline, "handover_deadline")
            self.dispatch = f"{int(window * 1000)}|{int(deadline * 1000)}|{int(RATE_LEAD * 1000)}"

    def lease_ms(self, lease_timeout: float | None) -> int:
        if lease_timeout is None:  # the semaphore's own, checked when it was made
            return max(1, int(1000 * self.lease_timeout))
        return max(1, int(1000 * validation.check_seconds(lease_timeout, "lease_timeout")))

    def acquire_args(
        self,
        holder: str,
        ticket: int | None,
        *,
        queue: bool,
        wait_lease: float | None,
        lease_timeout: float | None,
        info: str,
        handover: int | None = None,
        in_place: bool = False,
        ask: Ask = PLAIN,
    ) -> list[Any]:
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        weight_arg = self.weight_arg(ask)
        validation.check_ticket(handover, "handover")
        validation.check_info(info)
        wait_seconds = self.waiter_lease if wait_lease is None else wait_lease
        wait_ms = int(1000 * validation.check_seconds(wait_seconds, "wait_lease")) if queue else 0
        return [
            holder,
            self.limit,
            self.lease_ms(lease_timeout),
            wait_ms,
            "" if ticket is None else ticket,
            info,
            self.idle_ms,
            self.keys.channel,
            "" if handover is None else handover,
            self.dispatch,
            "1" if in_place else "",
            self.family,
            self.rate_arg,
            self.shadow_arg,
            weight_arg,
        ]

    def weight_arg(self, ask: Ask) -> str:
        """The scripts' weight text, "<permits>|<grants>" ('' for 1|1), checked against
        this semaphore's limit and burst: a weight that could never be granted is an
        error; then "|<priority>" and "|<fair weight>|<fair key>" where they are given
        (see "The order of the line" in lua/common.lua). ``fair_weight`` None: the
        semaphore's ``fair_weights`` say."""
        weight, rate_weight, priority = ask.weight, ask.rate_weight, ask.priority
        if (
            ask.fair_key is None
            and weight.__class__ is int
            and weight == 1
            and (rate_weight is None or (rate_weight.__class__ is int and rate_weight == 1))
            and priority.__class__ is int
            and priority == 0
        ):
            return ""  # what the checks below answer for the default: 1|1, no priority
        permits, grants = validation.check_weights(
            weight,
            rate_weight,
            self.name,
            self.limit,
            None if self.rate is None else self.rate.burst,
        )
        priority = validation.check_priority(priority)
        if ask.fair_key is not None:
            key = validation.check_fair_key(ask.fair_key)
            if ask.fair_weight is None:
                share = validation.fair_weight_of(self.fair_weights, key)
            else:
                share = validation.check_fair_weight(ask.fair_weight, key)
            return f"{permits}|{grants}|{priority}|{share}|{key}"
        if priority:
            return f"{permits}|{grants}|{priority}"
        return "" if permits == grants == 1 else f"{permits}|{grants}"

    def park_args(
        self,
        holder: str,
        ticket: int | None,
        payload: str,
        *,
        park_lease: float,
        info: str,
        due: float | None,
        ask: Ask | None = None,
    ) -> list[Any]:
        """``ask`` None keeps what the waiter's refused attempt recorded."""
        validation.check_holder(holder)
        validation.check_ticket(ticket)
        validation.check_info(info)
        if not isinstance(payload, str):
            raise TypeError(f"payload must be a str, got {type(payload).__name__}")
        park_ms, due_ms = self._parking(park_lease, due)
        weight_arg = "" if ask is None else (self.weight_arg(ask) or "1|1")
        return [holder, "" if ticket is None else ticket, payload, park_ms, info, self.idle_ms,
                self.dispatch, due_ms, self.keys.channel, weight_arg]  # fmt: skip

    def dispatch_args(self, drop: Iterable[str] = ()) -> list[Any]:
        """Declares no limit (see effective_limit() in common.lua): the heartbeat calls
        it on semaphores it knows only by name."""
        return [self.idle_ms, self.keys.channel, self.dispatch,
                *(validation.check_holder(h) for h in drop)]  # fmt: skip

    def enqueue_args(
        self, holder: str, wait_lease: float | None, info: str, ask: Ask = PLAIN
    ) -> list[Any]:
        validation.check_holder(holder)
        validation.check_info(info)
        weight_arg = self.weight_arg(ask)
        seconds = self.waiter_lease if wait_lease is None else wait_lease
        wait_ms = int(1000 * validation.check_seconds(seconds, "wait_lease"))
        return [holder, wait_ms, info, self.idle_ms, self.limit, self.family,
                self.sent_horizon_ms, self.keys.channel, self.rate_arg, weight_arg,
                self.shadow_arg]  # fmt: skip

    def park_when_far_args(
        self,
        payload: str | tuple[str, str],
        *,
        window: float,
        park_lease: float,
        due: float | None,
    ) -> list[Any]:
        """What enqueue.lua takes after `enqueue_args()` to park the waiter when its turn
        is far (ARGV[12..17]); ``payload``: the text, or (head, tail) around its ticket."""
        head, tail = (payload, "") if isinstance(payload, str) else payload
        if not (isinstance(head, str) and isinstance(tail, str)):
            raise TypeError(f"payload must be a str or a pair of str, got {payload!r:.80}")
        park_ms, due_ms = self._parking(park_lease, due)
        window_us = int(1_000_000 * validation.check_seconds(window, "window", allow_zero=True))
        return [window_us, head, tail, park_ms, self.dispatch, due_ms]

    def _parking(self, park_lease: float, due: float | None) -> tuple[int, int]:
        """A parking's lease and due time in ms (0: no due time), checked."""
        if not self.dispatch:
            raise ValueError(
                "park() needs a semaphore that publishes handovers: pass on_handover= "
                "(and handover_window=) to the semaphore"
            )
        park_ms = int(1000 * validation.check_seconds(park_lease, "park_lease"))
        due_ms = 0
        if due is not None:
            due_ms = max(1, int(1000 * validation.check_seconds(due, "due", allow_zero=True)))
        return park_ms, due_ms

    def parse_enqueue(self, reply: Sequence[Any]) -> Place:
        return self.binding(_enqueued_place(read(Enqueued, reply)))

    def parse_enqueue_or_park(self, reply: Sequence[Any]) -> tuple[Place, bool, list[Handover]]:
        place = read(EnqueuedOrParked, reply)
        return self.binding(_enqueued_place(place)), place.parked, place.handovers

    def binding(self, place: Place) -> Place:
        """``place`` as the limits that bind it see it: a shadow limit refuses nothing,
        so the line moves as if it were not there (common.lua's line_limit(),
        line_room()): ``limit_binds`` False; a shadow rate: no slot, no pause."""
        if not self.shadow:
            return place
        if "limit" in self.shadow:
            place = replace(place, limit_binds=False)
        if "rate" in self.shadow:
            place = replace(place, rate_due=None, rate_paused_for=None)
        return place

    def release_args(self, holder: str, token: int | None, *, unused: int = 0) -> list[Any]:
        """``unused``: the rate grants to give back with a permit its task never used."""
        validation.check_holder(holder)
        return [holder, "" if token is None else token, self.idle_ms, self.keys.channel,
                self.dispatch, self.limit, unused or "", self.shadow_arg]  # fmt: skip

    def renew_args(
        self, holders: Sequence[tuple[str, int | None, int | None]], lease_ms: int
    ) -> list[Any]:
        """``holders``: (holder, fencing token or None, permits held or None: as
        recorded). Declares no limit, like `dispatch_args()` and `configure_args()`."""
        args: list[Any] = [lease_ms, self.idle_ms, self.keys.channel, self.dispatch]
        for holder, token, permits in holders:
            weight = "" if permits is None else validation.check_limit(permits, "weight")
            args += [validation.check_holder(holder), "" if token is None else token, weight]
        return args

    def configure_args(self, field: str, value: str) -> list[Any]:
        return [field, value, self.idle_ms, self.keys.channel, self.dispatch, self.rate_arg]

    def status_args(self) -> list[Any]:
        return [STATUS_MOST, self.sent_horizon_ms, self.limit, self.rate_arg, FAIR_TOP]

    def pause(self, place: Place, remaining: float | None) -> float:
        """How long a blocked waiter sleeps unless woken: never past the earliest
        holder's lease end (whose reclaim may admit it) nor a third of its waiter lease."""
        pause = min(self.recheck_interval, self.waiter_lease / 3)
        if place.next_expiry_in is not None:
            pause = min(pause, place.next_expiry_in + 0.002)
        if place.resumes_in is not None:
            pause = min(pause, place.resumes_in + 0.002)
        if place.rate_due is not None and place.rate_due > 0:
            pause = min(pause, place.rate_due + 0.001)
        if remaining is not None:
            pause = min(pause, remaining)
        return max(pause, 0.001)

    @staticmethod
    def admits(message: Any, ticket: int) -> bool:
        """Whether a wake-up ``message`` (the highest ticket now admissible) can admit
        ``ticket``; a waiter with no ticket, or an unreadable message, tries anyway.
        A grant (`grant_in()`) admits nobody else."""
        data = text(message.get("data", "")) if isinstance(message, dict) else ""
        if data.startswith(GRANT_PREFIX):
            return False
        try:
            bound = float(data)
        except ValueError:
            return True
        return not ticket or ticket <= bound

    @staticmethod
    def grant_in(message: Any, holder: str) -> Grant | None:
        """The permit a wake-up ``message`` grants ``holder`` (a release handed it
        over to this waiter in place), else None."""
        data = text(message.get("data", "")) if isinstance(message, dict) else ""
        if not data.startswith(GRANT_PREFIX):
            return None
        granted, token, expires, waited = data[len(GRANT_PREFIX) :].rsplit("|", 3)
        if granted != holder:
            return None
        return Grant(int(token), int(expires) / 1000, int(waited) / 1000)

    def parse_acquire(self, reply: Sequence[Any]) -> tuple[Grant | Place, list[Handover]]:
        """The attempt's outcome and the parked waiters it made due (by reclaiming)."""
        code, *values = reply
        if code == 1:
            granted = read(Granted, values)
            return _grant(granted), granted.handovers
        if code == 0:
            refused = read(Refused, values)
            return self.binding(_place(refused)), refused.handovers
        if code == 2:
            raise StaleHandover(self.name, read(StaleCopy, values).token)
        raise ValueError(f"acquire.lua answered with unknown code {code!r}")

    @staticmethod
    def parse_park(reply: Sequence[Any]) -> tuple[Parked, list[Handover]]:
        parked = read(ParkReply, reply)
        return Parked(parked.ticket, parked.position), parked.handovers

    @staticmethod
    def parse_dispatch(reply: Sequence[Any]) -> list[Handover]:
        return read(DispatchReply, reply).handovers

    @staticmethod
    def parse_release(reply: Sequence[Any]) -> tuple[bool, list[Handover]]:
        released = read(ReleaseReply, reply)
        return released.released, released.handovers

    @staticmethod
    def parse_renew(reply: Sequence[Any]) -> tuple[float, set[str], list[Handover], int]:
        renewed = read(RenewReply, reply)
        return renewed.expires_ms / 1000, set(renewed.lost), renewed.handovers, renewed.restored

    @staticmethod
    def parse_configure(reply: Sequence[Any]) -> tuple[str | None, list[Handover]]:
        configured = read(ConfigureReply, reply)
        return configured.previous or None, configured.handovers

    def parse_status(self, reply: Sequence[Any]) -> SemaphoreStatus:
        status = read(StatusReply, reply)
        holders = []
        for row in status.holders:
            token, acquired, info = [*row.record.split("|", 2), "", ""][:3]
            acquired, _, permits = acquired.partition("/")
            holders.append(
                HolderInfo(
                    row.holder,
                    int(token or 0),
                    int(acquired or 0) / 1000,
                    row.expires_ms / 1000,
                    info,
                    int(permits or 1),
                )
            )
        holders.sort(key=lambda h: h.acquired_at)
        waiters = []
        for position, waiter in enumerate(status.waiters, 1):
            since, _, info = waiter.record.partition("|")
            waiters.append(
                WaiterInfo(
                    waiter.holder,
                    int(waiter.ticket),
                    position,
                    int(since or 0) / 1000,
                    waiter.expires_ms / 1000,
                    info,
                    WAITER_STATES[waiter.state],
                    fair_key_in(waiter.order),
                )
            )
        return SemaphoreStatus(
            name=self.name,
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
                WaiterInfo(sent.holder, 0, 0, sent.sent_ms / 1000, 0.0, "", "in broker")
                for sent in status.sent_without_place
            ],
            sent_without_place_count=status.sent_without_place_count,
            resumes_at=status.resumes_ms / 1000 if status.resumes_ms else None,
            rate=RateLimit.decode(status.rate),
            rate_override=RateLimit.decode(status.rate_override),
            rate_room=status.rate_room,
            next_start_at=status.next_start_ms / 1000 if status.rate else None,
            rate_paused_until=status.rate_paused_until_ms / 1000
            if status.rate_paused_until_ms
            else None,
            fair_keys_waiting=status.fair_keys_waiting,
            fair_grants=status.fair_grants,
            fair_keys=[
                FairKeyInfo(
                    row.key,
                    row.waiting,
                    row.grants,
                    round(row.grants / status.fair_grants, 3) if status.fair_grants else 0.0,
                )
                for row in status.fair_keys
            ],
            fair_keys_read=status.fair_keys_read,
            shadow_limit_refusals=status.shadow_limit_refusals,
            shadow_rate_refusals=status.shadow_rate_refusals,
            shadow_delay=status.shadow_wait_ms / 1000,
            shadow_peak=status.shadow_peak,
            shadow=shadow_kinds(status.recorded_shadow),
        )

    def expected_types(self) -> Iterable[tuple[str, str]]:
        return zip(self.keys.call_keys, (*ROLE_TYPES, "hash"), strict=True)


# Several semaphores at once (acquire_all.lua) -------------------------------------


def joint_acquire_args(
    specs: Sequence[SemaphoreSpec],
    holder: str,
    ticket: int | None,
    *,
    queue: bool,
    wait_lease: float | None,
    hold_back: float,
    lease_timeout: float | None,
    info: str,
    weights: Sequence[tuple[int, int | None]],
    priority: int = 0,
    fair_keys: Sequence[str | None] | None = None,
    fair_weight: int | None = None,
    handover: tuple[int, int] | None = None,
) -> list[Any]:
    """acquire_all.lua's arguments; ``weights``: (permits, grants or None) per semaphore;
    ``fair_keys``: per semaphore, at most one not None; ``handover``: (index of the
    semaphore that handed it over, the `Handover`'s token)."""
    validation.check_holder(holder)
    validation.check_ticket(ticket)
    validation.check_info(info)
    hold_ms = int(1000 * validation.check_seconds(hold_back, "hold_back", allow_zero=True))
    came_by = ""
    if handover is not None:
        index, token = handover
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(specs):
            raise ValueError(
                f"handover must be (index of a semaphore of the set, token), got {handover!r}"
            )
        came_by = f"{index + 1}|{validation.check_ticket(token, 'handover')}"
    args: list[Any] = [holder, hold_ms, info, "" if ticket is None else ticket, came_by]
    keys = [None] * len(specs) if fair_keys is None else list(fair_keys)
    if len(keys) != len(specs) or sum(key is not None for key in keys) > 1:
        raise ValueError(
            f"fair_keys must give one value per semaphore ({len(specs)}), at most one of "
            f"them a key (a set takes one fair line), got {fair_keys!r}"
        )
    for spec, (weight, rate_weight), key in zip(specs, weights, keys, strict=True):
        wait_seconds = spec.waiter_lease if wait_lease is None else wait_lease
        wait_ms = int(1000 * validation.check_seconds(wait_seconds, "wait_lease")) if queue else 0
        args += [
            spec.limit,
            spec.lease_ms(lease_timeout),
            wait_ms,
            spec.idle_ms,
            spec.keys.channel,
            spec.dispatch,
            spec.family,
            spec.rate_arg,
            spec.shadow_arg,
            spec.weight_arg(Ask(weight, rate_weight, priority, key, fair_weight)),
        ]
    return args


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
        return [_grant(row) for row in granted], [row.handovers for row in granted]
    if code == 0:
        ticket, refused_by, *rows = values
        if len(rows) != len(specs):
            raise ValueError(f"acquire_all.lua answered {len(rows)} of {len(specs)}: {reply!r}")
        refused = [read(Refused, row) for row in rows]
        places = Places(
            int(ticket),
            tuple(spec.binding(_place(row)) for spec, row in zip(specs, refused, strict=True)),
            tuple(i for i, flag in enumerate(text(refused_by)) if flag == "1"),
        )
        return places, [row.handovers for row in refused]
    if code == 2:
        by, token = values
        raise StaleHandover(specs[int(by) - 1].name, int(token or 0))
    raise ValueError(f"acquire_all.lua answered with unknown code {code!r}")


def joint_problem(
    members: Sequence[tuple[Any, str, SemaphoreSpec]], *, cluster: bool
) -> str | None:
    """Why semaphores (``members``: client, url, spec) cannot be taken in one script
    call, or None. ``cluster``: their client is a Redis Cluster's."""
    if not members:
        return "semaphores must name at least one semaphore"
    client, url, spec = members[0]
    problem = None
    for other_client, other_url, other in members[1:]:
        if other_client is not client and (not other_url or other_url != url):
            problem = (
                f"semaphores must share one Redis client (or URL): {spec.name!r} is on {url}, "
                f"{other.name!r} on {other_url}"
            )
        elif other.namespace != spec.namespace:
            problem = (
                f"semaphores must share one namespace: {spec.name!r} is in {spec.namespace!r}, "
                f"{other.name!r} in {other.namespace!r}"
            )
        if problem:
            return problem
    names = [member[2].name for member in members]
    slots = {
        name: key_slot(s.keys.meta.encode()) for name, (_, _, s) in zip(names, members, strict=True)
    }
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        problem = f"semaphores must have distinct names; given twice: {', '.join(twice)}"
    elif cluster and len(set(slots.values())) > 1:
        where = ", ".join(f"{name!r}: slot {slot}" for name, slot in slots.items())
        problem = (
            f"semaphores must have their keys in one Redis Cluster slot to be taken in one "
            f"step, and these are not ({where})"
        )
    elif len({member[2].keys.epoch for member in members}) > 1:
        problem = "semaphores must share one data epoch hash (one Redis, one Cluster slot)"
    return problem
