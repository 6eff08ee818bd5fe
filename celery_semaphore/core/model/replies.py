"""What the model answers: the values the scripts return (acquire.lua, enqueue.lua,
status.lua), as named fields, times on the semaphore's clock (ms, µs as named)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .order import Asked
from .parking import Dispatch
from .rate import Rate


class Declared(Enum):
    """A script that takes no rate from its caller (release, renew; configure and status
    when the caller has none) goes by the override, else the recorded rate."""

    NOTHING = "nothing"


NOTHING = Declared.NOTHING


@dataclass(frozen=True)
class Caller:
    """What a client declares with its calls (effective_limit() in lua/common_meta.lua,
    effective_rate() in lua/common_rates.lua): its ``limit``, its ``rate`` (None: none),
    its ``shadow`` limits ('', 'l', 'r' or 'lr': they count and refuse nobody), how
    long a task published with a place counts as sent (``sent_horizon_ms``), and, for a
    client that publishes handovers, its `Dispatch` (None: its calls hand over nobody)."""

    limit: int
    rate: Rate | None = None
    shadow: str = ""
    sent_horizon_ms: int = 3_600_000
    dispatch: Dispatch | None = None


@dataclass(frozen=True)
class Granted:
    """A permit (acquire.lua, code 1): its fencing ``token``, its lease's end, how long
    it waited in line, the shadow limits that would have refused it ('', 'l', 'r', 'lr')
    and by how many ms the shadow rate's slot was ahead."""

    token: int
    expires_ms: int
    waited_ms: int = 0
    shadow: str = ""
    shadow_wait_ms: int = 0


@dataclass(frozen=True)
class Refused:
    """A refusal (acquire.lua, code 0): ``ticket`` (0: not in line), ``position`` (1 +
    the waiters ahead), the permits held, the caller's effective limit, whether draining,
    the earliest holder lease end (0: no holder), µs until the rate allows it a grant
    (None: no rate) and until when a RateLimited pause lasts (0: none)."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    earliest_expiry_ms: int
    slot_us: int | None = None
    rate_pause_ms: int = 0


@dataclass(frozen=True)
class Stale:
    """A stale copy of a handed-over waiter (acquire.lua, code 2): it changes nothing;
    ``token``: the handover token of the copy handed over last."""

    token: int


@dataclass(frozen=True)
class ParkedPlace:
    """Where a parked waiter stands (park.lua): its ticket and position in line."""

    ticket: int
    position: int


@dataclass(frozen=True)
class Enqueued:
    """A place taken without asking (enqueue.lua): as `Refused`, without the lease and
    pause fields; ``parked``: it was parked at once (its turn was far)."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    slot_us: int | None = None
    parked: bool = False


@dataclass(frozen=True)
class HolderRow:
    holder: str
    token: int
    acquired_ms: int
    expires_ms: int
    info: str
    permits: int


@dataclass(frozen=True)
class WaiterRow:
    holder: str
    ticket: int
    since_ms: int
    expires_ms: int
    info: str
    #: Its recorded ask while any fair key has waiters (status.lua's weight text), else None.
    ask: Asked | None
    #: Its parked record's state: "p" parked, "h" handed over, else "" (asking itself).
    state: str = ""


@dataclass(frozen=True)
class FairKeyRow:
    key: str
    waiting: int
    grants: int


@dataclass(frozen=True)
class Status:
    """status.lua's reading: live entries only (a run-out lease not yet reclaimed is left
    out of the lists and counts, but not of the fair keys' counts)."""

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
    sent_without_place: list[str]
    rate: Rate | None
    rate_override: Rate | None
    rate_room: int
    next_start_ms: int
    rate_paused_until_ms: int
    fair_keys_waiting: int
    fair_grants: int
    fair_keys: list[FairKeyRow] = field(default_factory=list)
    shadow_limit_refusals: int = 0
    shadow_rate_refusals: int = 0
    shadow_wait_ms: int = 0
    shadow_peak: int = 0
    recorded_shadow: str = ""
